"""Every route's wrapper: the API-key and loading checks, the JSON body read within its limit, and ApiError
(or a ValueError from the engine) turned into the API's JSON error body."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgellm.server.http.auth import check_api_key
from edgellm.server.http.errors import ApiError
from edgellm.server.protocol import check_unicode
from edgellm.server.state import ServerState


class ErrorResponse(JSONResponse):
    """Error bodies as ASCII JSON: a message echoing client text (a lone surrogate, say) always encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(
    e: ApiError, state: ServerState | None = None, body: Callable[[ApiError], Any] | None = None
) -> JSONResponse:
    """The error as OpenAI's body, or as `body(e)` builds it for another API."""
    if state is not None:
        state.metrics.count_error(e.status)
    return ErrorResponse(e.body() if body is None else body(e), status_code=e.status, headers=e.headers)


Handler = Callable[[Request], Awaitable[Response]]


# After a request whose body was at least this large (its JSON, the tokenizer's work on it: hundreds of
# megabytes for a few-megabyte prompt), glibc is asked to hand the freed memory back to the kernel; it
# keeps it in its arenas otherwise, and the front-end's resident size stays at that peak.
TRIM_AFTER_BODY_BYTES = 1 << 20


@functools.cache
def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once (find_library runs `ldconfig -p`); None where there is none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to ask
        return None


def _malloc_trim() -> None:
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)


def endpoint(
    state: ServerState,
    auth: bool = True,
    needs_model: bool = True,
    error_body: Callable[[ApiError], Any] | None = None,
    x_api_key: bool = False,
) -> Callable[[Handler], Handler]:
    """Wrap a handler with the API-key check (`x_api_key`: that header may carry it too), the loading
    check and ApiError -> JSON conversion (OpenAI's error body, or `error_body(e)`)."""

    def wrap(fn: Handler) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                if auth and state.config.api_key is not None:
                    check_api_key(request, state.config.api_key, x_api_key)
                if needs_model and not state.ready.is_set():
                    raise ApiError(503, "the model is still loading", type="server_error", code="loading")
                return await fn(request)
            except ApiError as e:
                return error_response(e, state, error_body)
            except ValueError as e:  # SamplingParams and the engine reject bad values with ValueError
                return error_response(ApiError(400, str(e)), state, error_body)
            except RecursionError:  # a body just under json's nesting limit, walked a few frames deeper
                return error_response(ApiError(400, "the request is nested too deeply"), state, error_body)
            finally:
                if getattr(request.state, "body_bytes", 0) >= TRIM_AFTER_BODY_BYTES:
                    state.work_pool.submit(_malloc_trim)

        return handler

    return wrap


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, within `limit` bytes (413 past it), well-formed (400 naming what is
    wrong) and valid Unicode throughout."""
    return parse_json_object(await read_body(request, limit))


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, or a 413 past `limit` (a declared or sent size; what was sent is drained up to
    8x the limit first, so the client reads the answer instead of a reset)."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"request body exceeds {limit} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > 8 * limit:
        raise too_large  # not worth draining
    chunks, size = [], 0
    async for chunk in request.stream():  # drained past the limit so the client reads a clean 413
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > 8 * limit:
            break
    request.state.body_bytes = size
    if size > limit:
        raise too_large
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    check_unicode(body)
    return body
