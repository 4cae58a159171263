"""`python -m edgellm chat` in a real terminal: tmux runs it at 160x45 and `tmux capture-pane` reads the
screen. Textual's pilot drives the app inside the test's own event loop and reads widget state, so it
cannot see a screen that was never repainted; this test reads only what a user would see, and presses no
key before it expects the screen to have changed on its own.

Polling bounds are generous (a loaded 2-core machine, maybe a first Numba compile): they catch a screen
that never updates, not a slow one."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux): no real terminal"
)

MODEL = "smollm2-135m"
WIDTH, HEIGHT = 160, 45
EXITED = "chat process exited with status"

STATUS_LINE = re.compile(r"│ ctx \S+ │ TTFT [^│]+│ [^│]+ tok/s │ (\w+)")
STATUS_TPS = re.compile(r"│ ([\d.]+) tok/s │")
ASSISTANT_HEADER = re.compile(r"█ (Assistant\b.*?)\s*$")
SIDEBAR_BORDER, MESSAGE_BORDER = "▕", "█"  # the sidebar's right edge; a message's left edge
PANEL_ROW = re.compile(r"│\s(.*?)\s*│\s*$")  # a row inside the loading panel's rounded border


class Screen:
    """One captured frame of the terminal."""

    def __init__(self, text: str, at: float) -> None:
        self.text, self.at = text, at
        self.lines = text.splitlines()

    @property
    def state(self) -> str | None:
        """The status bar's state word (loading, ready, generating, error), None before it is drawn."""
        for line in reversed(self.lines):
            m = STATUS_LINE.search(line)
            if m:
                return m.group(1)
        return None

    def headers(self) -> list[str]:
        """The assistant message headers on screen, top to bottom ("Assistant · TTFT ... · stopped")."""
        return [m.group(1) for line in self.lines if (m := ASSISTANT_HEADER.search(line))]

    def loading_panel(self) -> list[str] | None:
        """The rows inside the loading panel (title, spinner, progress lines), None when it is not shown."""
        if not any("Loading " in line and "..." in line for line in self.lines):
            return None
        rows = [m.group(1).strip() for line in self.lines if (m := PANEL_ROW.search(line))]
        return [r for r in rows if r and not set(r) <= set("● ")]  # drop blank rows and the spinner

    def body_after_last_header(self) -> str:
        """The text of the last assistant message: the rows under its header that are inside its left
        border, read right of the sidebar (whose border glyph is no text of the reply)."""
        index = max(i for i, line in enumerate(self.lines) if ASSISTANT_HEADER.search(line))
        body = []
        for line in self.lines[index + 1 :]:
            column = line.split(SIDEBAR_BORDER, 1)[-1].strip()
            if not column.startswith(MESSAGE_BORDER):
                break
            body.append(column.removeprefix(MESSAGE_BORDER).strip())
        return "\n".join(body).strip()


class TmuxChat:
    """The chat in a detached tmux session on a private server whose socket lives in `data_dir`."""

    def __init__(self, data_dir: Path, model: str = MODEL, env: dict[str, str] | None = None) -> None:
        self.socket = str(data_dir / "tmux.sock")
        self.data_dir = data_dir
        self.model, self.env = model, env or {}
        self.started = 0.0
        self.frames: list[Screen] = []

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> None:
        env = {"EDGELLM_DATA_DIR": str(self.data_dir), "PYTHONPATH": str(ROOT), **self.env}
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # The app reads its size once at start (COLUMNS/LINES first, then the pty), and on a loaded machine
        # the pane's shell can start before tmux has sized the pty: wait for it, and drop a stale COLUMNS.
        # The pane stays after the app ends, saying how it ended: a crash is shown, not a blank screen.
        command = (
            f"while [ \"$(stty size)\" != '{HEIGHT} {WIDTH}' ]; do sleep 0.05; done; "
            f"cd {shlex.quote(str(ROOT))} && env -u COLUMNS -u LINES {assigns} {shlex.quote(sys.executable)} "
            f"-m edgellm chat {shlex.quote(self.model)}; echo '{EXITED}' $?; sleep 600"
        )
        self.started = time.monotonic()
        self.tmux("new-session", "-d", "-s", "chat", "-x", str(WIDTH), "-y", str(HEIGHT), command)

    def close(self) -> None:
        try:
            self.tmux("kill-server")
        except AssertionError:
            pass

    def capture(self) -> Screen:
        screen = Screen(self.tmux("capture-pane", "-p", "-t", "chat"), time.monotonic() - self.started)
        self.frames.append(screen)
        return screen

    def send_text(self, text: str) -> None:
        self.tmux("send-keys", "-t", "chat", "-l", text)

    def press(self, key: str) -> None:
        self.tmux("send-keys", "-t", "chat", key)

    def wait_for(
        self,
        what: str,
        condition: Callable[[Screen], bool],
        timeout: float,
        on_frame: Callable[[Screen], None] | None = None,
        stall: tuple[float, Callable[[Screen], object]] | None = None,
    ) -> Screen:
        """Poll the screen until `condition` holds; `on_frame` checks every frame seen on the way.
        `stall`: (seconds, progress): also fail once progress(screen) has not changed for that long, so a
        wait that takes long on a slow host but shows progress all along is bounded by the progress."""
        deadline = time.monotonic() + timeout
        last_progress, changed_at = None, time.monotonic()
        while True:
            screen = self.capture()
            if on_frame is not None:
                on_frame(screen)
            if condition(screen):
                return screen
            now = time.monotonic()
            if stall is not None and stall[1](screen) != last_progress:
                last_progress, changed_at = stall[1](screen), now
            if stall is not None and now - changed_at > stall[0]:
                raise AssertionError(f"no progress for {stall[0]:.0f} s towards {what}:\n{screen.text}")
            if EXITED in screen.text or now > deadline:
                raise AssertionError(f"not seen within {timeout:.0f} s: {what}. The screen:\n{screen.text}")
            time.sleep(0.05)


@pytest.fixture
def chat(tmp_path: Path, smollm2_path: Path):
    """The chat on SmolLM2-135M, greedy: "Say hello." gets a 23-token answer that ends by itself; the story
    runs to the 1000-token limit unless stopped."""
    settings = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 1000, "seed": 0, "system_prompt": ""}
    (tmp_path / "settings.json").write_text(json.dumps({"generation": settings, "model": MODEL}))
    session = TmuxChat(tmp_path)
    session.start()
    try:
        yield session
    finally:
        session.close()


def test_chat_repaints_every_state_change_in_a_real_terminal(chat: TmuxChat) -> None:
    # The first frame that shows the app at all shows the loading panel.
    first = chat.wait_for("the app's first frame", lambda s: s.state is not None, timeout=HANG_S)
    assert max(map(len, first.lines)) > WIDTH - 5, f"the app is not {WIDTH} columns wide:\n{first.text}"
    assert first.loading_panel() is not None, f"first frame without the loading panel:\n{first.text}"
    assert first.state == "loading"

    # Progress lines from the load thread appear by themselves, then the status turns ready; no key pressed.
    progress_seen: list[int] = []

    def panel_lines(screen: Screen) -> None:
        rows = screen.loading_panel()
        if rows is not None:
            progress_seen.append(len(rows) - 1)  # rows below the title

    # A cold Numba cache compiles for minutes on a slow host; the panel's progress lines (a "still
    # compiling... N s" every 5 s) show it going on: the bound is on 120 s without a new line.
    ready = chat.wait_for(
        "status ready after the load",
        lambda s: s.state == "ready",
        3600,
        panel_lines,
        stall=(120, Screen.loading_panel),
    )
    assert max(progress_seen, default=0) >= 2, "the load thread's progress lines never showed"
    assert ready.loading_panel() is None, f"loading panel still shown once ready:\n{ready.text}"
    assert re.search(r"│ ctx \d+/\d+ │", ready.text), f"context size not shown once ready:\n{ready.text}"

    # Replies: no header says "stopped", neither while a reply streams nor after it finished by itself.
    def not_stopped(screen: Screen) -> None:
        assert not any("stopped" in h for h in screen.headers()), f"reply labelled stopped:\n{screen.text}"

    chat.send_text("Say hello.")
    chat.press("Enter")
    done = chat.wait_for(
        "the first reply to finish",
        lambda s: s.state == "ready" and any("tok/s" in h for h in s.headers()),
        timeout=HANG_S,
        on_frame=not_stopped,
    )
    [header] = done.headers()
    assert "stopped" not in header and "tok/s" in header
    tps = STATUS_TPS.search(done.text)
    assert tps, f"no tok/s in the status bar:\n{done.text}"
    print(f"status bar after the first reply: {tps.group(1)} tok/s (under load)")

    # A long reply: frames of it streaming (one at least: the wait's own condition) are not labelled
    # stopped; once Esc stops it, it is, and the first reply still is not.
    chat.send_text("Write a long story about a dragon who learns to read.")
    chat.press("Enter")
    chat.wait_for(
        "the second reply streaming",
        lambda s: s.state == "generating" and len(s.headers()) == 2 and bool(s.body_after_last_header()),
        timeout=HANG_S,
        on_frame=not_stopped,
    )
    chat.press("Escape")
    stopped = chat.wait_for(
        "the stopped reply labelled", lambda s: s.state == "ready" and len(s.headers()) == 2, timeout=HANG_S
    )
    first_header, second_header = stopped.headers()
    assert "stopped" in second_header, f"reply stopped with Esc not labelled stopped:\n{stopped.text}"
    assert "TTFT" in second_header, f"the stopped reply lost the figures it streamed with:\n{stopped.text}"
    assert "stopped" not in first_header

    chat.press("C-q")
    chat.wait_for("the app to quit", lambda s: f"{EXITED} 0" in s.text, timeout=HANG_S)


def _settings(data_dir: Path, **changes: object) -> None:
    settings = {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 1000,
        "seed": 0,
        "system_prompt": "",
        **changes,
    }
    (data_dir / "settings.json").write_text(json.dumps({"generation": settings, "model": MODEL}))


def _saved_reply(path: Path) -> tuple[float, list[tuple[str, bool]]]:
    """The conversation file's save stamp and its messages' (role, partial); a streaming reply is saved
    partial, the ended one not."""
    data = json.loads(path.read_text(encoding="utf-8"))  # written by os.replace: never half a file
    return float(data["updated"]), [(m["role"], m["partial"]) for m in data["messages"]]


def _regenerated(path: Path, saved_before: float) -> bool:
    stamp, messages = _saved_reply(path)
    return stamp > saved_before and messages == [("user", False), ("assistant", False)]


def test_regenerate_replaces_the_length_limit_notice_in_a_real_terminal(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Ctrl+R regenerates a reply cut at max tokens: the old reply's "stopped at its length limit" notice
    goes with it, and the new reply's is the only one on screen."""
    _settings(tmp_path, max_tokens=8)
    chat = TmuxChat(tmp_path)
    chat.start()
    try:
        chat.wait_for("status ready", lambda s: s.state == "ready", timeout=HANG_S)
        chat.send_text("Write a long story about a dragon who learns to read.")
        chat.press("Enter")
        notice = "stopped at its length limit"
        cut = chat.wait_for("the length notice", lambda s: s.state == "ready" and notice in s.text, HANG_S)
        assert cut.text.count(notice) == 1
        [saved] = (tmp_path / "conversations").glob("*.json")
        before = _saved_reply(saved)
        chat.press("C-r")
        # An 8-token reply can stream between two captures, so "generating" may never be on screen: the
        # conversation file says the reply was made again (saved after it ends, with a later stamp).
        again = chat.wait_for(
            "the regenerated reply done",
            lambda s: s.state == "ready" and _regenerated(saved, before[0]),
            timeout=HANG_S,
        )
        assert again.text.count(notice) == 1 and len(again.headers()) == 1, again.text
    finally:
        chat.close()


def test_the_model_picker_sees_a_model_downloaded_while_the_chat_runs(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The catalog's list is looked up when Settings opens: a model that arrives in the models folder while
    the chat runs (another terminal's `edgellm pull`) is no longer "(not downloaded)"."""
    models = tmp_path / "models"
    models.mkdir()
    _settings(tmp_path)
    chat = TmuxChat(tmp_path, model=str(smollm2_path), env={"EDGELLM_MODELS_DIR": str(models)})
    chat.start()
    catalog_row = re.compile(rf"{MODEL}\s+\d+ MB.*$")

    def picker_row() -> str:
        chat.press("C-s")
        chat.wait_for("the settings dialog", lambda s: "Settings" in s.text and "Temperature" in s.text, 60)
        chat.press("Enter")  # the model picker has the focus: open its list
        shown = chat.wait_for("the model list", lambda s: any(catalog_row.search(x) for x in s.lines), 60)
        [row] = [m.group(0) for line in shown.lines if (m := catalog_row.search(line))]
        chat.press("Escape")
        chat.press("Escape")
        chat.wait_for("the chat again", lambda s: "Temperature" not in s.text, 60)
        return row

    try:
        chat.wait_for("status ready", lambda s: s.state == "ready", timeout=HANG_S)
        assert "(not downloaded)" in picker_row()
        (models / smollm2_path.name).symlink_to(smollm2_path)  # what `edgellm pull` leaves there
        assert "(not downloaded)" not in picker_row()
    finally:
        chat.close()
