"""The server when its engine core process dies: in-flight clients get errors, /health answers 503 with
the reason, a new core is started, and the server serves again."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgellm.testing.servers import MODEL, MSGS, NO_EOS, httpx
from edgellm.testing.servers import serve as _start


@pytest.fixture()
def server(smollm2_path: Path) -> Iterator[str]:
    yield from _start(smollm2_path)


def test_kill_9_of_the_core_under_load_errors_clients_then_restarts(server: str) -> None:
    pid = httpx.get(f"{server}/health").json()["core_pid"]
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 200, "stream": True, "logit_bias": NO_EOS}
    bodies: list[str] = []
    started = threading.Barrier(4 + 1, timeout=120)

    def client() -> None:
        text, signalled = "", False
        try:
            with httpx.Client(timeout=120) as c:
                with c.stream("POST", f"{server}/v1/chat/completions", json=body) as r:
                    for line in r.iter_lines():
                        text += line + "\n"
                        if '"content":"' in line and '"content":""' not in line and not signalled:
                            signalled = True
                            try:
                                started.wait()  # every stream has generated text: the core is busy
                            except threading.BrokenBarrierError:
                                pass
        except httpx.TransportError as e:
            text += f"transport error: {e!r}"
        bodies.append(text)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client was left waiting on a dead core"
    assert len(bodies) == 4
    for text in bodies:
        assert "[DONE]" not in text and "SIGKILL" in text, text[-500:]

    seen_503 = False
    deadline = time.monotonic() + 180
    while True:
        r = httpx.get(f"{server}/health", timeout=5)
        if r.status_code == 503:
            assert "SIGKILL" in r.json()["error"]
            seen_503 = True
        elif r.status_code == 200:
            break
        assert time.monotonic() < deadline, "the core was not restarted"
        time.sleep(0.05)
    assert seen_503
    assert r.json()["core_pid"] != pid
    ok = httpx.post(
        f"{server}/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 4}, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
