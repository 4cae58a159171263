"""HTTP-level attacks on the server (paths, Host headers, Authorization values, folded headers) and two
ways to send them: straight into the ASGI app (`AsgiClient`, no socket, no model) and as raw bytes over a
socket (`raw_request`, through uvicorn's parser). Shared by tests/server/test_server_untrusted.py,
tests/server/test_fuzz_protocol.py and scripts/soak/soak_bad_requests.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EVIL_HOST = "evil.example"

# Paths next to real routes: a trailing slash, doubled slashes, dot segments, an empty model name. None is
# a route; each must be a 404 (never a redirect), whatever the method and the key.
NEAR_MISS_PATHS = [
    "/metrics/", "/health/", "/v1/chat/completions/", "/chat/completions/",
    "/v1/completions/", "/v1/embeddings/", "/tokenize/", "/detokenize/", "//metrics", "//health",
    "/v1//chat/completions", "/v1/../metrics", "/./metrics", "/metrics/.", "/metrics//", "/metrics/x",
    "/api/chat/", "/api/tags/", "/api//chat", "//api/chat", "/api/version/", "/api/", "/api",
    "/v1/messages/", "/v1/messages/count_tokens/", "/v1/responses/", "/v1/responses/x/y", "/messages/",
]  # fmt: skip
# Raw request targets whose percent-decoding lands on or next to a route: (target, decoded path).
PERCENT_TARGETS = [
    ("/metrics%2F", "/metrics/"), ("/%6Detrics", "/metrics"), ("/health%2f", "/health/"),
    ("/v1/models%2F", "/v1/models/"), ("/v1%2Fmodels", "/v1/models"), ("/%2Fmetrics", "//metrics"),
]  # fmt: skip

# Authorization values, "K" standing for the key. Accepted: the Bearer scheme in any case, one or more
# spaces, the key. Refused: everything else a client or proxy might send.
_GOOD_AUTH = [b"Bearer K", b"bearer K", b"BEARER K", b"bEaReR K", b"Bearer  K", b"Bearer     K"]
_BAD_AUTH = [
    b"", b"K", b"Bearer", b"Bearer ", b"BearerK", b"Bearer\tK", b"Bearer \tK", b"Bearer K x", b"Bearer KK",
    b"Bearer K.", b"Basic K", b"Token K", b"Bearer K\xa0", b"Bearer \xa0K", b"Bearer \x85K", b"Bearer K\x85",
    b"Bearer\xa0K", b"Bearer K,", b"Bearer K;", b'Bearer "K"', b"Bearer =K", b"Bearer K=",
]  # fmt: skip


def good_auth(key: bytes) -> list[bytes]:
    return [v.replace(b"K", key) for v in _GOOD_AUTH]


def bad_auth(key: bytes) -> list[bytes]:
    return [v.replace(b"K", key) for v in _BAD_AUTH]


def folded_requests(path: str = "/v1/models") -> dict[str, bytes]:
    """Requests with a folded (obs-fold) header line: each must be a 400, whatever the header."""
    start = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    end = b"Connection: close\r\n\r\n"
    return {
        "key_on_a_continuation_line": start + b"Authorization: Bearer\r\n k\r\n" + end,
        "whole_value_folded": start + b"Authorization:\r\n Bearer k\r\n" + end,
        "tab_continuation": start + b"Authorization: Bearer\r\n\tk\r\n" + end,
        "other_header_folded": start + b"Authorization: Bearer k\r\nX-Note: a\r\n b\r\n" + end,
        "bare_lf_fold": start + b"Authorization: Bearer\n k\n" + end,
    }


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-cased names; the last value of a repeated header
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class AsgiClient:
    """Requests straight into an ASGI app: no server, no socket (and here, no model)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str | bytes]] = (),
        body: bytes = b"",
        host: str = "127.0.0.1",
    ) -> Answer:
        raw = [(b"host", host.encode())] + [
            (k.lower().encode(), v if isinstance(v, bytes) else v.encode("latin-1")) for k, v in headers
        ]
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "scheme": "http",
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1234),
            "headers": raw,
        }
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        start = sent[0]
        out_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Answer(start["status"], out_headers, content)

    def get(self, path: str, headers: Sequence[tuple[str, str | bytes]] = ()) -> Answer:
        return self.request("GET", path, headers)


def raw_request(port: int, data: bytes, timeout: float = 30.0) -> list[Answer]:
    """Send bytes to 127.0.0.1:port and parse every response until the server closes the connection
    (several when the bytes pipeline requests)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    answers = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers.get("content-length", "0"))
        answers.append(Answer(int(lines[0].split()[1]), headers, rest[:size]))
        received = rest[size:]
    return answers


def get_bytes(target: str, *headers: bytes, host: bytes = b"127.0.0.1") -> bytes:
    """A GET request's bytes that closes the connection after the answer (for raw_request)."""
    lines = [f"GET {target} HTTP/1.1".encode(), b"Host: " + host, *headers, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"
