"""Snapshots (pytest-textual-snapshot) of the chat TUI's main screens at a fixed terminal size, with a
scripted backend so no model output is involved. Update after a deliberate UI change with
`pytest tests/tui/test_tui_snapshots.py --snapshot-update` and look at the SVGs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import tui.app
from tests.scripted_backend import ScriptedBackend
from tui.app import ChatApp
from tui.messages import ChatMessage
from tui.storage import ConversationStore
from tui.widgets import PromptInput

SIZE = (100, 30)
MODELS = [("scripted  1 MB Q4_1", "scripted"), ("other  2 MB Q8_0  (not downloaded)", "other")]

CODE_REPLY = """Here is a function that adds two numbers:

```python
def add(a: int, b: int) -> int:
    return a + b
```

Call it as `add(2, 3)`, which returns **5**."""


def markdown_reply(messages: Sequence[ChatMessage]) -> str:
    return CODE_REPLY if "function" in messages[-1].content else f"You said: *{messages[-1].content}*"


class SteadyCursorApp(ChatApp):
    """The prompt's cursor does not blink: a capture in the blink's dark half (a busy host, where a screen
    takes longer than the half-second blink to settle) differed from the snapshot by the cursor alone."""

    CSS_PATH = Path(tui.app.__file__).with_name(ChatApp.CSS_PATH)  # a relative path is read beside this file

    async def on_mount(self) -> None:
        self.query_one(PromptInput).cursor_blink = False
        await super().on_mount()


def make_app(tmp_path: Path, **backend_kwargs) -> ChatApp:
    backend_kwargs.setdefault("reply_for", markdown_reply)
    return SteadyCursorApp(lambda m: ScriptedBackend(m, **backend_kwargs), "scripted",
                   store=ConversationStore(tmp_path), model_options=MODELS)


async def wait_for(pilot, condition, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached in time")


async def chat(pilot, *texts: str) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.state == "ready")
    for text in texts:
        n = len(app.conversation.messages)
        await pilot.press(*text, "enter")
        await wait_for(pilot, lambda n=n: len(app.conversation.messages) == n + 2 and not app.replying)
    await pilot.pause()


def test_main_screen_with_a_conversation(snap_compare, tmp_path: Path) -> None:
    async def run_before(pilot) -> None:
        await chat(pilot, "hello", "Write a Python function that adds two numbers")

    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare, tmp_path: Path) -> None:
    async def run_before(pilot) -> None:
        await chat(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()

    assert snap_compare(make_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_loading_screen_shows_progress(snap_compare, tmp_path: Path) -> None:
    lines = ["loading SmolLM2-135M-Instruct.Q4_1.gguf: llama, 30 layers, vocab 49152",
             "compiling Numba kernels (first start only; cached on disk afterwards)...",
             "  [1/2] prefill kernels ready (41.0 s)"]
    app = make_app(tmp_path, load_gate=asyncio.Event(), load_lines=lines)  # the load never finishes

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: len(pilot.app.query_one("#loading").lines) == 3)
        pilot.app.query_one("#loading LoadingIndicator").display = False  # its animation is time-based

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_load_error_screen(snap_compare, tmp_path: Path) -> None:
    app = make_app(tmp_path, load_error="Model not found: no model named 'nope': not a catalog name "
                                        "(gemma3-270m, smollm2-135m) and no such file")

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: pilot.app.state == "error")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_context_overflow_dialog(snap_compare, tmp_path: Path) -> None:
    app = make_app(tmp_path, n_ctx=64, reply_for=lambda m: " ".join(["word"] * 12))
    app.settings.max_tokens = 16

    async def run_before(pilot) -> None:
        await chat(pilot, "one", "two")
        await pilot.press(*"three", "enter")
        await wait_for(pilot, lambda: type(pilot.app.screen).__name__ == "ConfirmScreen")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
