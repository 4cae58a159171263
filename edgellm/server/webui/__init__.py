"""The browser chat page (issue 64): `GET /` answers a browser (its Accept names text/html) with a
single-page chat, and everyone else with Ollama's "Ollama is running" as before (Ollama clients probe it).
The page and its assets (this folder, shipped as package data) need no API key: they hold no data, and a
browser cannot send a key on a navigation. The page's own API calls carry the key (app.js asks for it).

Everything is served from here, so the page works offline, and its Content-Security-Policy allows
nothing else: no inline script or style, no other origin to load from or talk to (a model's reply that
slipped past the renderer still could not run or send anything anywhere). The page is same-origin with
the API, which the Host/Origin guard (server/http/stack.py) allows as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

HERE = Path(__file__).parent
ASSET_PREFIX = "/ui/"
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
ASSETS = ("app.js", "chat.js", "markdown.js", "store.js", "style.css", "icon.svg")
CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
# On every answer of this module: no MIME sniffing, no Referer to anywhere, revalidated on each load (an
# upgraded server's page never runs an old app.js).
COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

Handler = Callable[[Request], Awaitable[Response]]


@cache
def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def wants_page(request: Request) -> bool:
    """A browser navigating to / (Accept: text/html,...); curl, SDKs and Ollama clients ask for no HTML."""
    return "text/html" in request.headers.get("accept", "").lower()


KEY_META = b'<meta name="edgellm-api-key" content="none">'


def page_response(needs_key: bool) -> Response:
    """The page; `needs_key`: it says so in a meta tag, so the page asks for the key before its first call
    instead of learning it from a 401 (which a browser logs as an error)."""
    page = _read("index.html")
    if needs_key:
        page = page.replace(KEY_META, KEY_META.replace(b'"none"', b'"required"'))
    headers = {**COMMON_HEADERS, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"}
    return Response(page, media_type="text/html; charset=utf-8", headers=headers)


def page_or(other: Handler, needs_key: bool) -> Handler:
    """The `/` handler: the chat page for a browser, `other` (the Ollama answer, behind its key) otherwise."""

    async def root(request: Request) -> Response:
        if wants_page(request):
            return page_response(needs_key)
        return await other(request)

    return root


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:  # a fixed list: no path from the URL reaches the file system
        return Response("not found", status_code=404, media_type="text/plain", headers=COMMON_HEADERS)
    media_type = CONTENT_TYPES[Path(name).suffix]
    return Response(_read(name), media_type=media_type, headers=COMMON_HEADERS)


async def favicon(request: Request) -> Response:
    return Response(_read("icon.svg"), media_type=CONTENT_TYPES[".svg"], headers=COMMON_HEADERS)


def asset_routes() -> list[Route]:
    """The page's scripts, style sheet and icon, served without the key; the icon also where browsers
    look for one on any page of the origin (a 404 there is an error in the console)."""
    return [
        Route(ASSET_PREFIX + "{name}", asset, methods=["GET", "HEAD"]),
        Route("/favicon.ico", favicon, methods=["GET", "HEAD"]),
    ]
