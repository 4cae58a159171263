"""The multi-model router (`edgellm serve --models`) holds as the single server does (issue 53): the same
answers to bad input, --models-max under racing cold requests, /health while models swap, each API's error
event when a model's server dies mid-reply, and the API key never on a command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from edgellm.server.http.strict import FOLDED_MESSAGE
from edgellm.testing.http_attacks import EVIL_HOST, raw_request
from edgellm.testing.servers import child_pids, cmdline, httpx, start_server, stop_server
from edgellm.testing.synthetic.models import write_tiny_model

KEY = "router-secret-7f3a"


def _model_servers(router_pid: int) -> list[int]:
    return [p for p in child_pids(router_pid) if " serve " in cmdline(p)]


def _start_router(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    return start_server(None, *args, env=env)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("router_guard")
    a = str(write_tiny_model(d / "a.gguf", "llama", seed=1, context_length=4096))
    b = str(write_tiny_model(d / "b.gguf", "llama", seed=2))
    return a, b


def _raw(port: int, path: str, body: bytes, *headers: bytes, host: bytes = b"127.0.0.1") -> tuple[int, bytes]:
    head = [f"POST {path} HTTP/1.1".encode(), b"Host: " + host, b"Content-Type: application/json",
            f"Content-Length: {len(body)}".encode(), *headers, b"Connection: close"]  # fmt: skip
    [answer] = raw_request(port, b"\r\n".join(head) + b"\r\n\r\n" + body)
    return answer.status, answer.body


BAD_BODIES = {
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep_object": b'{"model": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_000 + b"}",
    "malformed": b'{"model": "x", ',
    "not_an_object": b"[1, 2]",
    "lone_surrogate": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "not_utf8": b'{"model": "\xff"}',
}


def test_the_router_answers_bad_input_as_the_single_server_does(
    apis_server: str, models: tuple[str, str]
) -> None:
    single = int(apis_server.rsplit(":", 1)[1])
    router, url = _start_router("--models", ",".join(models), "--ctx", "128")
    port = int(url.rsplit(":", 1)[1])
    try:
        for path in ("/v1/chat/completions", "/api/chat", "/v1/messages", "/v1/completions"):
            for name, body in BAD_BODIES.items():
                want = _raw(single, path, body)
                assert 400 <= want[0] < 500, (path, name, want)
                assert _raw(port, path, body) == want, (path, name)
            big = b'{"prompt": "' + b"x" * (5 * 2**20) + b'"}'  # past the 4 MiB default of both
            assert _raw(port, path, big) == _raw(single, path, big) and _raw(port, path, big)[0] == 413
            for extra, host in (((b"Origin: http://evil.example",), b"127.0.0.1"), ((), EVIL_HOST.encode())):
                status, text = _raw(port, path, b'{"model": "x"}', *extra, host=host)
                assert (status, text) == _raw(single, path, b'{"model": "x"}', *extra, host=host)
                assert status == 403, (path, extra, host, text)
        folded = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\r\n c\r\nConnection: close\r\n\r\n"
        assert [(a.status, a.body) for a in raw_request(port, folded)] == [(400, FOLDED_MESSAGE)]
        assert raw_request(port, b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n")[0].status == 200
        assert _model_servers(router.pid) == []  # none of it loaded a model
    finally:
        stop_server(router)


def test_models_max_holds_under_racing_cold_requests_and_health_answers_while_they_load(
    models: tuple[str, str],
) -> None:
    a, b = models
    router, url = _start_router("--models", f"{a},{b}", "--models-max", "1", "--ctx", "128")
    alive_most, watching = 0, True

    def watch() -> None:  # the model servers alive at any moment
        nonlocal alive_most
        while watching:
            alive_most = max(alive_most, len(_model_servers(router.pid)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        replies: dict[str, httpx.Response] = {}

        def ask(model: str) -> None:
            body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
            replies[model] = httpx.post(f"{url}/v1/completions", json=body, timeout=600)

        askers = [threading.Thread(target=ask, args=(m,)) for m in (a, b)]
        for t in askers:
            t.start()
        health_meanwhile = 0
        while any(t.is_alive() for t in askers):
            assert httpx.get(f"{url}/health", timeout=600).status_code == 200
            health_meanwhile += any(t.is_alive() for t in askers)
            time.sleep(0.02)
        assert health_meanwhile >= 2, health_meanwhile  # the loop answered while models started
        statuses = {m: r.status_code for m, r in replies.items()}
        assert 200 in statuses.values() and set(statuses.values()) <= {200, 503}, statuses
        for r in replies.values():
            if r.status_code == 503:  # the other was busy: its turn comes later
                assert r.headers["retry-after"] == "1" and "--models-max" in r.text, r.text
        for model in (b, a, b):  # swaps, one at a time
            body = {"model": model, "prompt": "hi", "max_tokens": 2}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=600).status_code == 200
    finally:
        watching = False
        watcher.join()
        stop_server(router)
    assert alive_most == 1, alive_most


HELLO = [{"role": "user", "content": "hello"}]
STREAMS = {  # path -> (body, what the API's error event looks like)
    "/v1/chat/completions": (
        {"messages": HELLO, "max_tokens": 3000, "temperature": 0, "stream": True},
        lambda lines: json.loads(lines[-1].removeprefix("data: "))["error"]["type"] == "server_error",
    ),
    "/api/chat": (
        {"messages": HELLO, "options": {"num_predict": 3000, "temperature": 0}},
        lambda lines: "failed" in json.loads(lines[-1])["error"],
    ),
    "/v1/messages": (
        {"messages": HELLO, "max_tokens": 3000, "temperature": 0, "stream": True},
        lambda lines: (
            lines[-2] == "event: error"
            and json.loads(lines[-1].removeprefix("data: "))["error"]["type"] == "api_error"
        ),
    ),
}


def test_a_model_server_dying_mid_stream_ends_each_apis_stream_with_its_error_and_the_key_stays_off_ps(
    models: tuple[str, str],
) -> None:
    a, _ = models
    env = {**os.environ, "EDGELLM_API_KEY": KEY}  # no --api-key: the environment form
    router, url = _start_router("--models", a, "--ctx", "4096", env=env)
    auth = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}
    try:
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        for path, (body, is_error_event) in STREAMS.items():
            request = {"model": a, **body}
            with httpx.stream("POST", f"{url}{path}", json=request, headers=auth, timeout=600) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(line for line in lines if line.strip())
                [server] = _model_servers(router.pid)
                # No process shows the key, and the model's server wants it on its own port as well.
                for pid in [router.pid, server, *child_pids(server)]:
                    assert KEY not in cmdline(pid), cmdline(pid)
                own = f"http://127.0.0.1:{cmdline(server).split(' --port ')[1].split()[0]}"
                assert httpx.get(f"{own}/v1/models", timeout=30).status_code == 401
                os.kill(server, signal.SIGSTOP)  # mid-reply: it sends nothing more
                os.kill(server, signal.SIGKILL)
                rest = [line for line in lines if line.strip()]
            assert rest and is_error_event([first, *rest]), (path, first, rest[-3:])
        everyone = [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))]
        assert not [p for p in everyone if KEY in cmdline(p)]
    finally:
        stop_server(router)
