"""uvicorn's h11 protocol, refusing folded header lines, and the uvicorn configuration the server runs.

A header line that starts with a space or tab continues the previous one (obs-fold, RFC 9112 section
5.2). h11 joins such lines with a space, so the app cannot tell `Authorization: Bearer\r\n k` from
`Authorization: Bearer k`, while a proxy in front may read the same bytes as two headers or drop the
continuation. RFC 9112 lets a server reject them with 400 instead; this protocol does, before h11 parses
the request, so no folded header reaches the app.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("edgellm.server")

_END_OF_HEADERS = re.compile(rb"\n\r?\n")  # h11's own test for the blank line
_FOLD = re.compile(rb"\n[ \t]")
FOLDED_MESSAGE = b"Bad request: a folded (obs-fold) header line; send each header on one line"


def has_folded_header(head: bytes) -> bool:
    """Whether the bytes of a request's start (request line and headers, perhaps more) fold a header."""
    end = _END_OF_HEADERS.search(head)
    return _FOLD.search(head, 0, end.start() if end else len(head)) is not None


class StrictH11Protocol(H11Protocol):
    """h11 as uvicorn runs it, except that a request with a folded header line is a 400 and the
    connection closes (what follows cannot be framed safely)."""

    def handle_events(self) -> None:
        # Called whenever data arrives and when a kept-alive connection's next request may start: while
        # the client's side is IDLE, everything h11 holds unparsed is the next request's start.
        if self.conn.their_state is h11.IDLE and has_folded_header(self.conn.trailing_data[0]):
            log.warning("refused a request with a folded header line from %s", self.client)
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(FOLDED_MESSAGE), FOLDED_MESSAGE)
            )
            self.transport.close()
            return
        super().handle_events()


def uvicorn_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=3,
        lifespan="on",
        http=StrictH11Protocol,
    )
