"""HTTP over a message stream, for the Ray Serve path (server/replicas/serve_app.py): the ingress forwards
each request (its ASGI scope and body) to an engine replica, which runs the ordinary server app (app.py) on it
and streams back the ASGI messages that app sends; the ingress relays them to the client. So every route,
error, auth check and SSE stream is the one server's, not a copy. No Ray here: the stream is any async
iterator.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from edgellm.server.http.endpoint import error_response
from edgellm.server.http.errors import ApiError
from edgellm.server.openai_format import sse

log = logging.getLogger("edgellm.server.ray")
Message = dict[str, Any]

# The scope keys an app needs, all plain data; the rest (app, router, state, extensions) stays behind.
_SCOPE_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "root_path",
    "query_string",
    "headers",
    "client",
    "server",
)


def portable_scope(scope: Scope) -> dict[str, Any]:
    """The scope as plain data that pickles: headers as a list of (bytes, bytes)."""
    out = {k: scope[k] for k in _SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    for k in ("client", "server"):
        if out.get(k) is not None:
            out[k] = tuple(out[k])
    return out


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, cut at limit + 1 bytes (enough for the app to answer 413), drained up to 8x the
    limit as errors.read_json does so the client reads a clean answer; None if the client went away."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        if size <= limit:
            chunks.append(chunk[: limit + 1 - size])
        size += len(chunk)
        if not msg.get("more_body", False) or size > 8 * limit:
            return b"".join(chunks)


async def app_messages(
    app: ASGIApp, scope: dict[str, Any], body: bytes, extra_headers: list[tuple[bytes, bytes]]
) -> AsyncIterator[Message]:
    """Run `app` on one request and yield what it sends, `extra_headers` added to the response head.
    Closing the iterator (the ingress cancelled: its client went away) cancels the app, which aborts
    the engine requests as on a disconnect."""
    queue: asyncio.Queue[Message | None] = asyncio.Queue()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # a disconnect arrives as cancellation instead
        raise AssertionError("unreachable")

    async def send(msg: Message) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", []), *extra_headers]}
        queue.put_nowait(msg)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(run())
    try:
        while (msg := await queue.get()) is not None:
            yield msg
        await task  # re-raises what the app raised (Starlette answers errors itself; this is a bug)
    finally:
        task.cancel()


def _is_sse(start: Message) -> bool:
    headers = start.get("headers", [])
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


def _carries_output(body: bytes) -> bool:
    """Whether an SSE body chunk gives the client something generated: a token, a finish, usage, an
    error or the end. A chat stream's opening chunk (the role, no content) does not."""
    for line in body.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            return True  # "[DONE]", or not ours to judge
        if not isinstance(event, dict) or "error" in event or event.get("usage"):
            return True
        for c in event.get("choices") or []:
            if c.get("text") or (c.get("delta") or {}).get("content") or c.get("finish_reason"):
                return True
    return False


class Relay:
    """Relays one request's response from a replica stream to the client, opening a new stream (another
    replica) when the replica is gone before any output reached the client: an SSE stream's head and
    opening chunk are held back until its first token (they would name a request the retry replaces).
    After that, a lost replica ends the response as the one server ends it when its engine dies: an
    in-band error event on an SSE stream, else a cut body."""

    def __init__(
        self,
        retryable: Callable[[BaseException], bool],
        error_for: Callable[[BaseException], ApiError | None] = lambda e: None,
        max_attempts: int = 3,
    ) -> None:
        """retryable(e): the replica is gone (another may serve the request); error_for(e): the answer
        for a failure that is not the replica's (a full queue, say), else None for a 503."""
        self.retryable, self.error_for, self.max_attempts = retryable, error_for, max_attempts
        self.retries = 0  # requests sent again because their replica was lost before any output

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        open_stream: Callable[[], tuple[AsyncIterator[Message], Callable[[], None]]],
    ) -> str | None:
        """Returns None on success, else why the response failed (for the caller's metrics/logs)."""
        for attempt in range(1, self.max_attempts + 1):
            cancel: Callable[[], None] = lambda: None
            held: list[Message] = []  # not sent yet: a retry may still replace them
            released = streaming = False
            try:
                stream, cancel = open_stream()
                async for msg in stream:
                    if released:
                        await send(msg)
                        continue
                    held.append(msg)
                    if msg["type"] == "http.response.start":
                        streaming = _is_sse(msg)
                    elif not streaming or not msg.get("more_body") or _carries_output(msg.get("body", b"")):
                        for m in held:
                            await send(m)
                        released = True
                return None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure is answered; the reason is logged
                reason = f"the engine replica failed: {e.__class__.__name__}: {_first_line(e)}"
                if not released and self.retryable(e) and attempt < self.max_attempts:
                    log.warning("%s; retrying on another replica (attempt %d)", reason, attempt + 1)
                    self.retries += 1
                    continue
                err = self.error_for(e)
                if err is None:
                    log.error("%s", reason)
                    err = ApiError(503, reason, type="server_error", code="replica_failed")
                if not released:
                    await error_response(err)(scope, receive, send)
                elif streaming:
                    body = sse(err.body()).encode()
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                else:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return reason
            finally:
                cancel()
        raise AssertionError("unreachable")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
