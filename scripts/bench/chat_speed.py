"""The chat's streaming speed in a real terminal against `edgellm bench`'s batch-1 decode, reply by reply.

Each round: `python -m edgellm chat MODEL` runs in tmux (WIDTHxHEIGHT), a prompt is typed, and when the
status bar leaves "generating" its tok/s and context use are read off the screen; right after each reply,
one batch-1 greedy decode of the same prompt and reply lengths runs as `edgellm bench` runs it (its own
`LLM` in this process, so its own engine core: `edgellm.cli.bench.batch1_run`), then the reply is regenerated
(Ctrl+R, the same lengths) until there are --replies pairs; --rounds chats (edgellm/testing/ab.py). A
pair's two runs are seconds apart, so the machine's speed drifting over minutes (it does, by 10-20% on a
shared VM) cancels in each pair's ratio; the figure to quote is the median of the pairs' ratios. Prints
one JSON line per round (its pairs, the CPU seconds the UI and its engine core used per reply) and a
summary. The chat runs on a throwaway data directory: default settings, and nothing added to your saved
conversations.
`--echo` also types a few keys while the first reply streams and times each until the terminal shows it
(what a user typing the next message meanwhile waits for); that typing costs the UI some CPU of its own.

    python scripts/bench/chat_speed.py smollm2-135m --rounds 3 [--replies 5] [--echo]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

from edgellm.testing.ab import alternate, medians

PROMPT = "Write a long detailed story about a dragon who learns to cook."
STATUS = re.compile(r"ctx (\d+)/\d+ │ TTFT [^│]+│ ([\d.]+) tok/s │ (\w+)")
LENGTH_LIMIT = re.compile(r"length limit \((\d+) tokens\)")  # the notice under a reply cut at max tokens
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


def reply_tok_s(n_prompt: int) -> tuple[float, int, int, str]:
    """Wait for the reply under way to finish: (tok/s, context used, reply tokens, state) off the screen.
    The reply's tokens: the length-limit notice's count when it was cut there, else the context used less
    the prompt (which also counts the end-of-turn tokens the template adds after the reply)."""
    s = wait_for(lambda s: "generating" not in s and STATUS.search(s) is not None, 600)
    ctx, tps, state = STATUS.search(s).groups()
    cut = LENGTH_LIMIT.findall(s)
    return float(tps), int(ctx), int(cut[-1]) if cut else int(ctx) - n_prompt, state


def chat_round(model: str, llm, n_prompt: int, width: int, height: int, echo: bool, replies: int) -> dict:
    """One chat session: its replies, each paired with a batch-1 bench decode of the same lengths."""
    from edgellm.cli.bench import batch1_run

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
        chat, bench, ui_cpu, core_cpu = [], [], 0.0, 0.0
        echo_ms = None
        for i in range(replies):  # the first reply, then regenerations of it (Ctrl+R: the same lengths)
            before = cpu_seconds(ui), cpu_seconds(core)
            if i:
                subprocess.run(["tmux", "send-keys", "-t", SESSION, "C-r"])
            else:
                subprocess.run(["tmux", "send-keys", "-t", SESSION, PROMPT, "Enter"])
            wait_for(lambda s: "generating" in s, 60)
            if echo and not i:
                echo_ms = echo_latencies_ms()
            tps, ctx, n_gen, state = reply_tok_s(n_prompt)
            ui_cpu += cpu_seconds(ui) - before[0]
            core_cpu += cpu_seconds(core) - before[1]
            chat.append(tps)
            bench.append(round(batch1_run(llm, n_prompt, max(2, n_gen), salt=i + 1)[1], 1))
        return {
            "chat_tok_s": chat,
            "bench_tok_s": bench,
            "ratios": [round(c / b, 3) for c, b in zip(chat, bench, strict=True)],
            "ctx_used": ctx,
            "reply_tokens": n_gen,
            "state": state,
            "ui_cpu_s_per_reply": round(ui_cpu / replies, 2),
            "core_cpu_s_per_reply": round(core_cpu / replies, 2),
            **({"echo_ms": echo_ms} if echo else {}),
        }
    finally:
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "C-q"])
        time.sleep(1)
        subprocess.run(["tmux", "kill-session", "-t", SESSION], stderr=subprocess.DEVNULL)


def prompt_tokens(llm) -> int:
    """Tokens of the chat's prompt for PROMPT (its template, as the TUI renders it)."""
    from tui.messages import ChatMessage
    from tui.prompt import render_prompt_ids

    return len(render_prompt_ids(llm, [ChatMessage("user", PROMPT)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replies", type=int, default=5, help="replies per chat, each paired with a bench run")
    ap.add_argument("--width", type=int, default=160)
    ap.add_argument("--height", type=int, default=45)
    ap.add_argument("--echo", action="store_true", help="time key echo while the first reply streams")
    a = ap.parse_args()
    from edgellm import LLM
    from edgellm.cli.bench import batch1_run

    with LLM(a.model) as llm:
        n_prompt = prompt_tokens(llm)
        batch1_run(llm, n_prompt, 16)  # warm-up, as `edgellm bench` runs one
        chat = partial(chat_round, a.model, llm, n_prompt, a.width, a.height, a.echo, a.replies)

        def report(r: int, _: str, c: dict) -> None:
            print(json.dumps({"round": r, "prompt_tokens": n_prompt, **c}), flush=True)

        [rounds] = alternate({"chat": chat}, a.rounds, report=report).values()
    # the pairs of every round together: their ratios' median is the figure
    pairs = {k: [x for c in rounds for x in c[k]] for k in ("ratios", "chat_tok_s", "bench_tok_s")}
    med = medians(pairs)
    print(
        json.dumps(
            {
                "pairs": len(pairs["ratios"]),
                "ratio_median": round(med["ratios"], 3),
                "ratio_quartiles": [round(q, 3) for q in statistics.quantiles(pairs["ratios"], n=4)],
                "chat_tok_s_median": med["chat_tok_s"],
                "bench_tok_s_median": med["bench_tok_s"],
            }
        )
    )


if __name__ == "__main__":
    main()
