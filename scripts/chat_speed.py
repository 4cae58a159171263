"""The chat's streaming speed in a real terminal against `edgellm bench` at the same lengths, alternating.

Each round: `python -m edgellm chat MODEL` runs in tmux (WIDTHxHEIGHT), a prompt is typed, and when the
status bar leaves "generating" its tok/s and context use are read off the screen; the reply is regenerated
(Ctrl+R, the same lengths) until there are --replies readings, whose median is the round's figure, as
`edgellm bench` reports the median of its --repeat runs; with the CPU seconds the UI process and the
engine-core process used per reply. Then `edgellm bench` runs batch-1 with the chat's prompt and reply
lengths. Prints one JSON line per round and the medians with their ratio. The chat runs on a throwaway
data directory: default settings, and nothing added to your saved conversations.
`--echo` also types a few keys while the reply streams and times each until the terminal shows it (what a
user typing the next message meanwhile waits for); that typing costs the UI some CPU of its own.
`--stop-ui` also runs each round's chat with the UI process stopped (SIGSTOP) while each reply decodes:
the engine's speed in the chat with no drawing, so the drawing's cost and the rest can be told apart.

    python scripts/chat_speed.py smollm2-135m --rounds 3 [--echo]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "Write a long detailed story about a dragon who learns to cook."
STATUS = re.compile(r"ctx (\d+)/\d+ │ TTFT [^│]+│ ([\d.]+) tok/s │ (\w+)")
SESSION = "edgellm-chat-speed"
DATA_DIR = tempfile.mkdtemp(prefix="edgellm-chat-speed-")
atexit.register(shutil.rmtree, DATA_DIR, ignore_errors=True)
PASSED_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "EDGELLM_UI_NICENESS", "EDGELLM_UI_CPU_SHARE")


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True).stdout


def screen() -> str:
    return sh("tmux", "capture-pane", "-p", "-t", SESSION)


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_core_pid(ui: int) -> int:
    """The UI's engine-core child (multiprocessing also starts a resource tracker, which is not it)."""
    for pid in sh("pgrep", "-P", str(ui)).split():
        if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read():
            return int(pid)
    raise RuntimeError(f"no engine core process under the chat's pid {ui}")


def wait_for(pred, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = screen()
        if pred(s):
            return s
        time.sleep(0.1)
    raise TimeoutError(screen())


def echo_latencies_ms(n: int = 4) -> list[int]:
    """Type n short words into the chat's input, one at a time: ms until each shows on the screen."""
    out = []
    for i in range(n):
        word = f"zq{i}xw"
        t0 = time.monotonic()
        subprocess.run(["tmux", "send-keys", "-t", SESSION, word])
        wait_for(lambda s, w=word: w in s, 60)
        out.append(round((time.monotonic() - t0) * 1000))
        time.sleep(0.2)
    return out


def reply_tok_s() -> tuple[float, int, str]:
    """Wait for the reply under way to finish: the status bar's (tok/s, context used, state)."""
    s = wait_for(lambda s: "generating" not in s and STATUS.search(s) is not None, 600)
    ctx, tps, state = STATUS.search(s).groups()
    return float(tps), int(ctx), state


def hold_ui_until_core_idle(ui: int, core: int) -> None:
    """Stop the UI process (SIGSTOP) while the engine core decodes the reply, resume it once the core's
    CPU time stops growing: the reply's speed without any drawing (its tokens keep the core's times)."""
    start = cpu_seconds(core)
    end = time.monotonic() + 30
    while cpu_seconds(core) - start < 0.05 and time.monotonic() < end:  # the request reached the core
        time.sleep(0.005)
    os.kill(ui, signal.SIGSTOP)
    try:
        last, still = cpu_seconds(core), 0
        while still < 3:
            time.sleep(0.2)
            now = cpu_seconds(core)
            still = still + 1 if now - last < 0.02 else 0
            last = now
    finally:
        os.kill(ui, signal.SIGCONT)


def chat_round(
    model: str, width: int, height: int, echo: bool = False, replies: int = 3, stop_ui: bool = False
) -> dict:
    subprocess.run(["tmux", "kill-session", "-t", SESSION], stderr=subprocess.DEVNULL)
    # the settings under test reach the chat explicitly (a running tmux server keeps its own environment)
    passed = " ".join(f"{k}={os.environ[k]}" for k in PASSED_ENV if k in os.environ)
    passed += f" EDGELLM_DATA_DIR={DATA_DIR}"  # default settings; the user's conversations untouched
    cmd = f"env {passed} {sys.executable} -m edgellm chat {model}"
    subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", str(width), "-y", str(height), cmd])
    try:
        wait_for(lambda s: "│ ready" in s, 300)
        ui = int(sh("tmux", "display", "-p", "-t", SESSION, "#{pane_pid}").strip())
        core = engine_core_pid(ui)
        before = {ui: cpu_seconds(ui), core: cpu_seconds(core)}
        subprocess.run(["tmux", "send-keys", "-t", SESSION, PROMPT, "Enter"])
        wait_for(lambda s: "generating" in s, 60)
        echo_ms = echo_latencies_ms() if echo else None
        speeds = []
        for i in range(replies):  # the first reply, then regenerations of it (Ctrl+R: the same lengths)
            if i:
                subprocess.run(["tmux", "send-keys", "-t", SESSION, "C-r"])
                wait_for(lambda s: "generating" in s, 60)
            if stop_ui:
                hold_ui_until_core_idle(ui, core)
            tps, ctx, state = reply_tok_s()
            speeds.append(tps)
        return {
            "chat_tok_s": round(statistics.median(speeds), 1),
            "reply_tok_s": speeds,
            "ctx_used": ctx,
            "state": state,
            "ui_cpu_s_per_reply": round((cpu_seconds(ui) - before[ui]) / replies, 2),
            "core_cpu_s_per_reply": round((cpu_seconds(core) - before[core]) / replies, 2),
            **({"echo_ms": echo_ms} if echo else {}),
        }
    finally:
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "C-q"])
        time.sleep(1)
        subprocess.run(["tmux", "kill-session", "-t", SESSION], stderr=subprocess.DEVNULL)


def prompt_tokens(model: str) -> int:
    """Tokens of the chat's prompt for PROMPT (its template, as the TUI renders it)."""
    from edgellm import LLM
    from tui.messages import ChatMessage
    from tui.prompt import render_prompt_ids

    with LLM(model) as llm:
        return len(render_prompt_ids(llm, [ChatMessage("user", PROMPT)]))


def bench_round(model: str, n_prompt: int, n_gen: int) -> float:
    out = sh(
        sys.executable, "-m", "edgellm", "bench", model, "--prompt-tokens", str(n_prompt),
        "--gen-tokens", str(n_gen), "--json",
    )  # fmt: skip
    return float(json.loads(out.strip().splitlines()[-1])["decode_tok_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=160)
    ap.add_argument("--height", type=int, default=45)
    ap.add_argument("--echo", action="store_true", help="time key echo while the reply streams")
    ap.add_argument("--replies", type=int, default=3, help="replies per chat (median), as bench's --repeat")
    ap.add_argument("--stop-ui", action="store_true", help="also time each round's chat with its UI stopped")
    args = ap.parse_args()
    n_prompt = prompt_tokens(args.model)
    chats, benches, stopped = [], [], []
    for r in range(args.rounds):
        c = chat_round(args.model, args.width, args.height, args.echo, args.replies)
        if args.stop_ui:
            c["ui_stopped_tok_s"] = chat_round(
                args.model, args.width, args.height, False, args.replies, True
            )["chat_tok_s"]
            stopped.append(c["ui_stopped_tok_s"])
        n_gen = max(1, c["ctx_used"] - n_prompt)
        b = bench_round(args.model, n_prompt, n_gen)
        chats.append(c["chat_tok_s"])
        benches.append(b)
        print(json.dumps({"round": r, **c, "prompt_tokens": n_prompt, "gen_tokens": n_gen, "bench_tok_s": b}))
    chat, bench = statistics.median(chats), statistics.median(benches)
    per_round = statistics.median(c / b for c, b in zip(chats, benches, strict=True))
    summary = {
        "chat_tok_s_median": chat,
        "bench_tok_s_median": bench,
        "ratio": round(chat / bench, 3),
        "per_round_ratio_median": round(per_round, 3),
    }
    if stopped:  # the engine's speed in the chat without the UI drawing: what the drawing costs
        summary["ui_stopped_ratio"] = round(
            statistics.median(s / b for s, b in zip(stopped, benches, strict=True)), 3
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
