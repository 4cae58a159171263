"""What one request, or one web page, must not be able to do to the server (issue 53): freeze it with a
megabyte prompt, make it hold that memory, or drive it from another site (a foreign Origin, or a foreign
Host as DNS rebinding sends). In process (the ASGI app, no model) for the Host/Origin matrix; against a
real server process for the big prompts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.server.app import build_app
from edgellm.server.state import ServerState
from edgellm.testing.http_attacks import EVIL_HOST, AsgiClient
from edgellm.testing.servers import MODEL, httpx, start_server, stop_server

# Routes of every API; the model is not loaded in process, so a request the guard lets through gets 503.
ROUTES = [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/chat/completions"),
    ("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("POST", "/tokenize"), ("GET", "/metrics"),
    ("POST", "/api/chat"), ("POST", "/api/generate"), ("GET", "/api/tags"), ("POST", "/v1/messages"),
    ("POST", "/v1/responses"), ("POST", "/infill"), ("GET", "/nope"),
]  # fmt: skip
LOCAL_HOSTS = ["127.0.0.1:8080", "localhost:8080", "LocalHost", "[::1]:8080", "::1", "127.0.0.2", "127.0.0.1"]
FOREIGN_HOSTS = [EVIL_HOST, f"{EVIL_HOST}:8080", "127.0.0.1.evil.example", "localhost.evil.example", ""]
FOREIGN_ORIGINS = [
    f"http://{EVIL_HOST}", "null", "http://localhost:3000", "http://127.0.0.1:9999", "https://127.0.0.1",
    "file://", "http://127.0.0.1:8080.evil.example",
]  # fmt: skip
TEXT_PLAIN = ("Content-Type", "text/plain")  # what a page sends cross-origin without a preflight


def _app(**config: object) -> AsgiClient:
    return AsgiClient(build_app(ServerState(ServerConfig(EngineConfig("unused.gguf"), **config))))  # type: ignore[arg-type]


def _message(path: str, body: object) -> str:
    """The error message in the body of `path`'s API."""
    assert isinstance(body, dict), body
    if path.startswith("/api/"):
        assert isinstance(body["error"], str)  # Ollama's shape
        return body["error"]
    if path == "/v1/messages":
        assert body["type"] == "error"  # Anthropic's
    return body["error"]["message"]


@pytest.mark.parametrize("method,path", ROUTES)
def test_a_foreign_host_or_origin_is_a_403_in_the_apis_shape(method: str, path: str) -> None:
    app = _app()
    for host in LOCAL_HOSTS:
        a = app.request(method, path, [TEXT_PLAIN], host=host)
        assert a.status != 403, (host, a)
    for host in FOREIGN_HOSTS:
        a = app.request(method, path, [TEXT_PLAIN], host=host)
        assert a.status == 403 and "is not a name of this server" in _message(path, a.json()), (host, a)
    for origin in FOREIGN_ORIGINS:
        a = app.request(method, path, [TEXT_PLAIN, ("Origin", origin)], host="127.0.0.1:8080")
        assert a.status == 403 and "--cors-origin" in _message(path, a.json()), (origin, a)
        assert "access-control-allow-origin" not in a.headers
    # the server's own pages: the origin of the Host the request came to
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"):
        a = app.request(method, path, [TEXT_PLAIN, ("Origin", f"http://{host}")], host=host)
        assert a.status != 403, (host, a)


def test_health_answers_whatever_the_host_and_origin() -> None:
    app = _app()
    for headers, host in [([], EVIL_HOST), ([("Origin", f"http://{EVIL_HOST}")], "127.0.0.1"), ([], "")]:
        a = app.request("GET", "/health", headers, host=host)
        assert (a.status, a.json()) == (503, {"status": "loading"}), (headers, host)


def test_cors_origins_are_allowed_with_their_preflight_and_others_still_refused() -> None:
    app = _app(cors_origins=("http://ok.example:3000",))
    ok = [("Origin", "http://ok.example:3000")]
    pre = app.request(
        "OPTIONS", "/v1/chat/completions", ok + [("Access-Control-Request-Method", "POST")], host="127.0.0.1"
    )
    assert pre.status == 200 and pre.headers["access-control-allow-origin"] == "http://ok.example:3000"
    a = app.request("POST", "/v1/chat/completions", ok + [TEXT_PLAIN], host="127.0.0.1")
    assert a.status == 503 and a.headers["access-control-allow-origin"] == "http://ok.example:3000"
    evil = [("Origin", f"http://{EVIL_HOST}"), ("Access-Control-Request-Method", "POST")]
    assert app.request("OPTIONS", "/v1/chat/completions", evil, host="127.0.0.1").status == 403
    assert app.request("POST", "/v1/chat/completions", evil, host="127.0.0.1").status == 403
    anyone = _app(cors_origins=("*",))
    assert anyone.request("GET", "/v1/models", [("Origin", "null")], host="127.0.0.1").status == 503


def test_bound_to_every_interface_any_host_is_a_name_but_origins_still_count() -> None:
    app = _app(host="0.0.0.0")
    assert app.request("GET", "/v1/models", [], host="my-desktop.lan:8080").status == 503
    assert app.request("GET", "/v1/models", [("Origin", f"http://{EVIL_HOST}")], host="x").status == 403
    bound = _app(host="192.168.7.9")
    assert bound.request("GET", "/v1/models", [], host="192.168.7.9:8080").status == 503
    assert bound.request("GET", "/v1/models", [], host=EVIL_HOST).status == 403


# ---- a real server: megabyte prompts ------------------------------------------------------------------
BIG = ("The quick brown fox jumps over the lazy dog. " * 80_000)[:3_400_000]  # under the 4 MiB body limit
BIG_BODIES = {
    "/v1/completions": {"model": MODEL, "prompt": BIG, "max_tokens": 4},
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": BIG}], "max_tokens": 4},
    "/api/generate": {"model": MODEL, "prompt": BIG, "stream": False},
    "/api/chat": {"model": MODEL, "messages": [{"role": "user", "content": BIG}], "stream": False},
    "/v1/messages": {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": BIG}]},
    "/v1/responses": {"model": MODEL, "input": BIG},
    "/v1/embeddings": {"model": MODEL, "input": BIG},
    "/api/embed": {"model": MODEL, "input": BIG},
}


@pytest.fixture(scope="module")
def big_server(smollm2_path: Path) -> Iterator[tuple[str, int]]:
    proc, url = start_server(str(smollm2_path), "--ctx", "512", "--threads", "1")
    try:
        yield url, proc.pid
    finally:
        stop_server(proc)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("path", sorted(BIG_BODIES))
def test_a_prompt_that_cannot_fit_is_refused_by_its_size_before_tokenizing(
    big_server: tuple[str, int], path: str
) -> None:
    url, _ = big_server
    r = httpx.post(f"{url}{path}", json=BIG_BODIES[path], timeout=300)
    assert r.status_code == 400, r.text
    # "at least": the count is the size bound, so the 3.4 MB were never tokenized (that is ~755,000 tokens)
    message = _message(path, r.json())
    assert "maximum context length is 512 tokens" in message and "resulted in at least" in message, message
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200


def test_tokenizing_megabytes_leaves_the_event_loop_free_and_the_memory_returned(
    big_server: tuple[str, int],
) -> None:
    url, pid = big_server
    before = _rss_kib(pid)
    result: list[httpx.Response] = []
    big = threading.Thread(
        target=lambda: result.append(httpx.post(f"{url}/tokenize", json={"content": BIG}, timeout=600))
    )
    big.start()
    answered_meanwhile = 0
    while big.is_alive():
        # Tokenizing on the event loop (or holding the GIL throughout) would hold these until it ends.
        assert httpx.get(f"{url}/health", timeout=600).status_code == 200
        answered_meanwhile += big.is_alive()
        time.sleep(0.02)
    big.join()
    assert result[0].status_code == 200 and result[0].json()["count"] > 700_000
    assert answered_meanwhile >= 3, answered_meanwhile
    deadline = time.monotonic() + 60  # the trim runs on a work thread after the reply
    while _rss_kib(pid) > before + 150_000 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rss_kib(pid) <= before + 150_000, (before, _rss_kib(pid))
