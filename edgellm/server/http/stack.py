"""The HTTP layer the single-model server (app.py) and the multi-model router (server/multi/routes.py) share,
so that both answer the same bytes the same way: strict parsing (server/http/strict.py, in uvicorn_config),
the local-only guard below, CORS for the origins `--cors-origin` allows, and errors in each API's shape.

The local-only guard is what Ollama does against web pages (its allowedHostsMiddleware and origin list):
- A page on another site can POST to a loopback server without a preflight (`Content-Type: text/plain`
  is a "simple" request), and with DNS rebinding (its own name resolving to 127.0.0.1) read the replies.
  So a request whose `Host` is not a name of this server (localhost, a loopback address, the address it
  is bound to) gets 403; bound to every interface (0.0.0.0, ::) any name is one of its names, and the
  check is off (such a server wants `--api-key`: run_server warns without one).
- A request that carries an `Origin` gets 403 unless that origin is this server itself (the same scheme,
  name and port as its `Host`: a page the server serves) or one `--cors-origin` allows ('*': any). SDKs
  and curl send no `Origin` and are unaffected; `Origin: null` (sandboxed frames, file pages) is refused.
- /health answers everyone, as it always has: it tells a load balancer whether the model is up.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from edgellm.server.http.compat import cors_middleware
from edgellm.server.http.endpoint import error_response
from edgellm.server.http.errors import ApiError, anthropic_error_body, ollama_error_body

log = logging.getLogger("edgellm.server")

OPEN_PATHS = frozenset({"/health"})  # answered whatever the Host and Origin
_LOCAL_NAMES = frozenset({"localhost"})


def api_of(path: str) -> str:
    """Which API a path belongs to, for the shape of its error body."""
    if path == "/" or path.startswith("/api/"):
        return "ollama"
    return "anthropic" if path.removeprefix("/v1").startswith("/messages") else "openai"


ERROR_BODIES: dict[str, Callable[[ApiError], Any] | None] = {
    "ollama": ollama_error_body,
    "anthropic": anthropic_error_body,
    "openai": None,  # ApiError.body(), OpenAI's
}


def api_error_response(e: ApiError, path: str, count: Callable[[ApiError], None] | None = None) -> Response:
    """The error as the body of the API `path` belongs to; `count` sees it first (the server's metrics)."""
    if count is not None:
        count(e)
    return error_response(e, None, ERROR_BODIES[api_of(path)])


def _host_name(host: str) -> str:
    """The name in a Host header value, without its port: `[::1]:8080` -> `::1`, `Localhost:80` ->
    `localhost`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _is_unspecified(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_unspecified
    except ValueError:
        return False


class LocalOnly:
    """ASGI middleware: 403 for a foreign `Host` or `Origin` (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        bound_host: str,
        cors_origins: Sequence[str] = (),
        count: Callable[[ApiError], None] | None = None,
    ) -> None:
        self.app, self.count = app, count
        bound = _host_name(bound_host)
        self.any_host = _is_unspecified(bound)
        self.names = _LOCAL_NAMES | {bound}
        self.any_origin = "*" in cors_origins
        self.origins = frozenset(o.rstrip("/").lower() for o in cors_origins)

    def _host_ok(self, host: str | None) -> bool:
        if host is None or self.any_host:  # HTTP/1.0 may send none; a browser always does
            return True
        name = _host_name(host)
        return name in self.names or _is_loopback(name)

    def _origin_ok(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if self.any_origin or origin in self.origins:
            return True
        # The server's own pages: the origin is the scheme and the Host the request came to.
        return host is not None and origin in (f"http://{host.lower()}", f"https://{host.lower()}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, list[bytes]] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k, []).append(v)
        hosts, origins = headers.get(b"host", []), headers.get(b"origin", [])
        host = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        problem = None
        if len(hosts) > 1:
            problem = "more than one Host header"
        elif not self._host_ok(host):
            problem = f"Host {host!r} is not a name of this server (DNS rebinding?)"
        elif len(origins) > 1:
            problem = "more than one Origin header"
        elif origins and not self._origin_ok(origins[0].decode("latin-1"), host):
            problem = (
                f"requests from web pages of origin {origins[0].decode('latin-1')!r} are refused "
                "(allow an origin with --cors-origin)"
            )
        if problem is None:
            await self.app(scope, receive, send)
            return
        log.warning("refused %s %s: %s", scope["method"], scope["path"], problem)
        e = ApiError(403, problem, type="permission_error", code="forbidden")
        await api_error_response(e, scope["path"], self.count)(scope, receive, send)


def http_stack(
    bound_host: str, cors_origins: Sequence[str], count: Callable[[ApiError], None] | None = None
) -> dict[str, Any]:
    """Starlette's `middleware` and `exception_handlers` for a server bound to `bound_host`: the guard
    outermost (before CORS answers a preflight), then CORS, and no route or method (404/405) and an
    unexpected error (500, logged) in the API's error shape. `count`: each error the stack itself makes."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        e = ApiError(exc.status_code, msg, type=kind, code=str(exc.status_code))
        return api_error_response(e, request.url.path, count)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        e = ApiError(500, f"internal error: {exc!r}", type="server_error")
        return api_error_response(e, request.url.path, count)

    guard = Middleware(LocalOnly, bound_host=bound_host, cors_origins=tuple(cors_origins), count=count)
    return {
        "middleware": [guard, *cors_middleware(cors_origins)],
        "exception_handlers": {HTTPException: http_error, Exception: server_error},
    }
