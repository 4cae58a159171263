"""`edgellm serve` as a subprocess on a free loopback port, and a streamed chat request that reports what
the replica tests and benchmarks look at (shared by tests/test_ray_serve.py and
scripts/ray_serve_bench.py)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def start_server(model: str | None, *args: str, ready_timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """`python -m edgellm serve MODEL ARGS` on a free port, returned once it prints its URL line (with
    --replicas that is once every replica has loaded). MODEL None: ARGS name the models (--models)."""
    port = free_port()
    cmd = [sys.executable, "-m", "edgellm", "serve", *([model] if model else []), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and (line := proc.stdout.readline()):
        lines.append(line)
        if line.startswith("edgellm: serving"):  # keep draining: a chatty Ray must not block on the pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()
    raise RuntimeError("the server did not start:\n" + "".join(lines[-40:]))


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> int:
    """Ctrl-C, as a user stops it; killed if it does not end within `timeout`. Returns its exit status."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


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
