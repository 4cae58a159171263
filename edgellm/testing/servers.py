"""The one server launcher of the tests and scripts: `edgellm serve` (or `python -m edgellm.server`) as a
subprocess on a free loopback port, waited for by its URL line or by /health; the server tests' model
constants and /metrics reader; and a streamed chat request that reports what the replica tests and
benchmarks look at."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgellm.testing.limits import HANG_S

try:  # the openai client's HTTP library: httpx, or httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
# Two unrelated system prompts of ~1,000 tokens each (SmolLM2's tokenizer: ~11 tokens a sentence).
LONG_SYSTEM_PROMPTS = {
    "a": "You are a guide to the history of Rome. "
    + "The city was founded on seven hills by the Tiber. " * 100,
    "b": "You are a baker's assistant. " + "Bread needs flour, water, salt, yeast and patience. " * 100,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The CLI's `serve`, and the server module's own entry point (it takes the engine-core options).
SERVE = ("edgellm", "serve")
SERVER_MODULE = ("edgellm.server",)
# The server tests' defaults: a short context and one kernel thread (no OpenMP spin-waiting against the
# test client on a 2-core machine).
CTX = 256
MODEL = "SmolLM2-135M-Instruct.Q4_1"
MSGS = [{"role": "user", "content": "What is the capital of France?"}]
NO_EOS = {"0": -100, "2": -100, "4": -100}  # SmolLM2's end-of-generation ids: keeps a request running


def child_pids(pid: int) -> list[int]:
    """The process's children (of every thread: a server starts its model servers from worker threads)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class ServerStartError(RuntimeError):
    """The server exited, or did not become ready in time."""


def spawn(
    args: list[str] | tuple[str, ...],
    entry: tuple[str, ...] = SERVE,
    stdout: Any = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start `python -m ENTRY ARGS --port PORT` on a free loopback port without waiting; returns
    (process, URL). stdout: a pipe (read by the waits below) or an open log file; env: the process's
    environment (None: this one's)."""
    port = free_port()
    cmd = [sys.executable, "-m", *entry, *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float, poll: float = 0.05) -> None:
    """Poll /health until 200; while the model loads the answer must be 503 {"status": "loading"}."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout is not None else ""
            raise ServerStartError(f"the server exited with {proc.returncode}\n{out}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return
            if not (r.status_code == 503 and r.json()["status"] == "loading"):
                raise AssertionError(f"/health answered {r.status_code} {r.text} while loading")
        except httpx.TransportError:
            pass
        if time.monotonic() >= deadline:
            raise ServerStartError(f"the server did not become healthy in {timeout} s")
        time.sleep(poll)


def start_server(
    model: str | None, *args: str, ready_timeout: float = HANG_S, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`python -m edgellm serve MODEL ARGS` on a free port, returned once it prints its URL line (with
    --replicas that is once every replica has loaded). MODEL None: ARGS name the models (--models)."""
    proc, url = spawn([*([model] if model else []), *args], env=env)
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and (line := proc.stdout.readline()):
        lines.append(line)
        if line.startswith("edgellm: serving"):  # keep draining: a chatty Ray must not block on the pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, url
    proc.kill()
    proc.wait()
    raise RuntimeError("the server did not start:\n" + "".join(lines[-40:]))


def stop_server(proc: subprocess.Popen, timeout: float = 60, check: bool = True) -> int:
    """Ctrl-C, as a user stops it; killed if it does not end within `timeout` (and, with `check`,
    TimeoutExpired raised). Returns its exit status."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        if check:
            raise
        return proc.returncode


def serve(model: Path | str, *args: str, ctx: int = CTX, timeout: float = HANG_S) -> Iterator[str]:
    """A pytest fixture body (`yield from serve(path, ...)`): `python -m edgellm.server MODEL --ctx CTX
    --threads 1 ARGS`, its URL yielded once /health answers 200 (timeout: a hang guard, limits.HANG_S),
    stopped with Ctrl-C afterwards."""
    proc, url = spawn([str(model), "--ctx", str(ctx), "--threads", "1", *args], entry=SERVER_MODULE)
    try:
        wait_healthy(proc, url, timeout)
        yield url
    finally:
        stop_server(proc, timeout=10, check=False)


def metrics(url: str, key: str | None = None) -> dict[str, float]:
    """The /metrics gauges and counters by name, the model_name label dropped."""
    out = {}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for line in httpx.get(f"{url}/metrics", headers=headers).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "")] = float(value)
    return out


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    messages: list[dict[str, Any]],
    max_tokens: int = 16,
    headers: dict[str, str] | None = None,
    on_first_token: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """A streamed greedy chat request: status, replica (x-edgellm-replica), text, ttft (s), cached
    prompt tokens, and error (an error body, or an in-band error event) or None. `on_first_token(out)`
    is called when the first token arrives."""
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    body["stream_options"] = {"include_usage": True}
    out: dict[str, Any] = {"text": "", "ttft": None, "error": None, "cached": None}
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        out["status"], out["replica"] = r.status_code, r.headers.get("x-edgellm-replica")
        if r.status_code != 200:
            out["error"] = json.loads(await r.aread())["error"]
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["error"] = chunk["error"]
            elif chunk.get("usage"):
                out["cached"] = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                if out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - t0
                    if on_first_token is not None:
                        on_first_token(out)
                out["text"] += chunk["choices"][0]["delta"]["content"]
    out["seconds"] = time.perf_counter() - t0
    return out
