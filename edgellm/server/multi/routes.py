"""The routes of `edgellm serve --models` (server/multi/router.py's ModelRouter), as Ollama serves several
models: every model route of the single-model server (OpenAI, Ollama, Anthropic, Responses, /tokenize,
/infill) is relayed by the body's `model` field to that model's server, loading it first if need be (no
`model`: the first model named, as llama.cpp's router does; the model's server then says whether its API wants
one); the listing routes (/v1/models, /api/tags, /api/ps, /api/version, /api/pull, /) are answered here,
across the models. Errors the router makes itself come in the API's own shape, as the model's server makes
them; the API-key check is auth.py's, with `x-api-key` on the Anthropic routes as there.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client.core import GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edgellm.config import DEFAULT_MAX_BODY_BYTES
from edgellm.server.generate import _until_disconnect
from edgellm.server.http.auth import check_api_key
from edgellm.server.http.compat import with_unprefixed
from edgellm.server.http.endpoint import parse_json_object, read_body, read_json
from edgellm.server.http.errors import ApiError, anthropic_error_body, ollama_error_body
from edgellm.server.http.stack import api_error_response, api_of, http_stack
from edgellm.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgellm.server.multi.router import ModelsBusyError
from edgellm.server.ollama import routes as ollama_api
from edgellm.server.ollama.models import file_entry, pull_progress
from edgellm.server.ollama.options import opt_bool
from edgellm.server.openai_format import sse
from edgellm.server.replicas.replica_metrics import families_page, merge_pages
from edgellm.server.webui import asset_routes, page_or

if TYPE_CHECKING:
    from edgellm.server.multi.router import ModelRouter, ModelSlot

try:  # the openai client's HTTP library: httpx, or httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

# POST routes relayed to the model the body names (the /v1 ones also without the prefix, as served there).
RELAYED = (
    "/v1/chat/completions", "/v1/chat/completions/input_tokens", "/v1/completions", "/v1/embeddings",
    "/v1/responses",
    "/v1/messages", "/v1/messages/count_tokens",
    "/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show",
    "/tokenize", "/detokenize", "/infill", "/completion", "/apply-template",
    "/v1/rerank", "/v1/reranking",  # a reranker's (server/rerank.py)
)  # fmt: skip
# Not relayed: the connection's own headers, and Origin (the router's guard has judged it; the model's
# server, on loopback with no --cors-origin, would refuse what the router allowed).
_HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "origin"}
Handler = Callable[[Request], Awaitable[Response]]


def stream_error(path: str, e: ApiError, events_sent: int) -> bytes:
    """The in-band error a streamed reply of `path`'s API ends with, as the model's server itself writes
    it when its engine fails mid-reply (`events_sent`: the Responses API numbers its events)."""
    api = api_of(path)
    if api == "ollama":
        return (json.dumps(ollama_error_body(e)) + "\n").encode()
    if api == "anthropic":
        body = anthropic_error_body(e)
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    if path.removeprefix("/v1") == "/responses":
        body = {"type": "error", "sequence_number": events_sent, "code": e.code, "message": e.message}
        return ("event: error\n" + sse({**body, "param": e.param})).encode()
    return sse(e.body()).encode()


def _tag_entry(router: ModelRouter, slot: ModelSlot) -> dict[str, Any]:
    """The model's /api/tags entry from its file (read once); a catalog model not downloaded yet (its
    server downloads it when loaded) is listed by name alone."""
    if slot.tag_entry is None:
        from edgellm.gguf.reader import load_gguf_part
        from edgellm.models.catalog import resolve_model

        try:
            path = resolve_model(slot.name, download=False)
            slot.tag_entry = file_entry(path, load_gguf_part(path).metadata, slot.name)
        except (OSError, ValueError):
            return {"name": slot.name, "model": slot.name, "size": 0, "details": {"format": "gguf"}}
    return slot.tag_entry


def router_metrics_page(router: ModelRouter) -> str:
    """The router's own gauges, as a Prometheus page."""
    loaded = GaugeMetricFamily("edgellm_router_models_loaded", "Models whose server is running.")
    loaded.add_metric([], sum(s.loaded for s in router.slots.values()))
    help_ = "Requests relayed to a model and not yet done."
    in_flight = GaugeMetricFamily("edgellm_router_requests_in_flight", help_, labels=["model_name"])
    for slot in router.slots.values():
        in_flight.add_metric([slot.name], slot.in_flight)
    return families_page([loaded, in_flight])


def build_router_app(
    router: ModelRouter,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    cors_origins: tuple[str, ...] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The router's routes behind the single server's HTTP stack (server/http/stack.py: the Host/Origin guard
    for a server bound to `host`, CORS, errors in each API's shape; the body limit and JSON checks of
    endpoint.py); with `api_key` every route but /health wants it (the models' servers too)."""
    names = ", ".join(router.slots)
    default = next(iter(router.slots.values()))

    def endpoint(handler: Handler) -> Handler:
        """The key check and ApiError -> the error body of the request's API."""

        async def checked(request: Request) -> Response:
            path = request.url.path
            try:
                if api_key is not None:
                    check_api_key(request, api_key, x_api_key=api_of(path) == "anthropic")
                return await handler(request)
            except ApiError as e:
                return api_error_response(e, path)
            except RecursionError:  # a body just under json's nesting limit, walked a few frames deeper
                return api_error_response(ApiError(400, "the request is nested too deeply"), path)

        return checked

    def unknown(name: str) -> ApiError:
        msg = f"model {name!r} is not served here; available: {names}"
        return ApiError(404, msg, type="not_found_error", param="model", code="model_not_found")

    async def acquire(slot: ModelSlot) -> None:
        try:
            await router.acquire(slot)
        except ModelsBusyError as e:
            retry = {"Retry-After": "1"}
            raise ApiError(503, str(e), "server_error", code="unavailable", headers=retry) from None
        except RuntimeError as e:  # its server did not start
            raise ApiError(503, str(e), type="server_error", code="unavailable") from None

    def slot_for(body: dict[str, Any], path: str) -> ModelSlot:
        name = body.get("model")
        if name is None and path.startswith("/api/"):
            name = body.get("name")  # older Ollama clients
        if name is None:
            return default
        if not isinstance(name, str):
            raise ApiError(400, f"'model' must be a string, got {type(name).__name__}", param="model")
        slot = router.slots.get(name)
        if slot is None:
            raise unknown(name)
        return slot

    def failed(slot: ModelSlot, e: Exception) -> ApiError:
        return ApiError(502, f"model {slot.name}'s server failed: {e!r}", type="server_error")

    @endpoint
    async def relay(request: Request) -> Response:
        path = request.url.path
        raw = await read_body(request, max_body_bytes)
        slot = slot_for(parse_json_object(raw), path)
        await acquire(slot)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        try:
            upstream = await router.client.send(
                router.client.build_request("POST", f"{slot.url}{path}", content=raw, headers=headers),
                stream=True,
            )
        except httpx.HTTPError as e:
            router.release(slot)
            raise failed(slot, e) from None
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
        content_type = upstream.headers.get("content-type", "")
        separator = b"\n\n" if "event-stream" in content_type else b"\n" if "ndjson" in content_type else None
        if separator is None:  # one JSON reply: read whole, so a server dying now is a 502, not half a body
            try:
                body = await _until_disconnect(request, upstream.aread())
            except httpx.HTTPError as e:
                raise failed(slot, e) from None
            finally:
                router.release(slot)
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
            return Response(body, status_code=upstream.status_code, headers=kept)

        async def events():
            # NDJSON lines and SSE events pass through whole, as they come; if the model's server dies
            # mid-reply, the stream ends with the API's error event after the last whole one. A client
            # that goes away cancels this generator (Starlette watches for the disconnect); closing the
            # upstream stream then tells the model's server, which cancels the request there.
            pending, sent = b"", 0
            try:
                async for chunk in upstream.aiter_raw():
                    pending += chunk
                    cut = pending.rfind(separator) + len(separator)
                    if cut >= len(separator):
                        sent += pending.count(separator, 0, cut)
                        yield pending[:cut]
                        pending = pending[cut:]
                if pending:
                    yield pending
            except httpx.HTTPError as e:
                yield stream_error(path, failed(slot, e), sent)
            finally:
                router.release(slot)
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()

        return StreamingResponse(events(), status_code=upstream.status_code, headers=kept)

    def card(slot: ModelSlot) -> dict[str, Any]:
        return {"id": slot.name, "object": "model", "owned_by": "edgellm", "status": {"loaded": slot.loaded}}

    @endpoint
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [card(s) for s in router.slots.values()]})

    @endpoint
    async def one_model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in router.slots:
            raise unknown(name)
        return JSONResponse(card(router.slots[name]))

    @endpoint
    async def tags(request: Request) -> Response:
        entries = await asyncio.to_thread(lambda: [_tag_entry(router, s) for s in router.slots.values()])
        return JSONResponse({"models": entries})

    @endpoint
    async def ps(request: Request) -> Response:
        """Each loaded model's own /api/ps entry (its context length), expiring `--keep-alive` seconds
        after its last request (or from now while it has requests in flight)."""
        auth = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        out = []
        for slot in [s for s in router.slots.values() if s.loaded]:
            try:
                r = await router.client.get(f"{slot.url}/api/ps", headers=auth, timeout=30)
                entries = r.raise_for_status().json()["models"]
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # gone since: not loaded
            idle_since = time.time() - (time.monotonic() - slot.last_used if not slot.in_flight else 0)
            expires = dt.datetime.fromtimestamp(idle_since + router.keep_alive, dt.UTC)
            stamp = expires.isoformat(timespec="seconds").replace("+00:00", "Z")
            out += [{**e, "expires_at": stamp} for e in entries]
        return JSONResponse({"models": out})

    @endpoint
    async def metrics(request: Request) -> Response:
        """Every loaded model's /metrics (each labelled with its model_name) as one page, with the
        router's own gauges: models loaded, requests in flight per model."""
        auth = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        pages = {"router": router_metrics_page(router)}
        for slot in [s for s in router.slots.values() if s.loaded]:
            try:
                r = await router.client.get(f"{slot.url}/metrics", headers=auth, timeout=30)
                pages[slot.name] = r.raise_for_status().text
            except httpx.HTTPError:
                continue  # gone since: not loaded
        return PlainTextResponse(await asyncio.to_thread(merge_pages, pages), media_type=METRICS_CONTENT_TYPE)

    @endpoint
    async def pull(request: Request) -> Response:
        """Nothing to download: a model the router serves is there (its server fetches a catalog model
        when it loads); any other name is a 404 listing them."""
        body = await read_json(request, max_body_bytes)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model': expected a model name", param="model")
        opt_bool(body, "insecure")
        stream = opt_bool(body, "stream")
        slot = router.slots.get(name) or router.slots.get(name.removesuffix(":latest"))
        if slot is None:
            raise unknown(name)
        if stream is False:
            return JSONResponse({"status": "success"})
        steps = [{"status": "success"}]
        try:
            from edgellm.models.catalog import resolve_model

            steps = pull_progress(await asyncio.to_thread(resolve_model, slot.name, False))
        except (OSError, ValueError):
            pass  # a catalog model its server downloads when it loads: nothing here to show
        lines = (json.dumps(step) + "\n" for step in steps)
        return StreamingResponse(lines, media_type=ollama_api.NDJSON)

    @endpoint
    async def version(request: Request) -> Response:
        return JSONResponse({"version": ollama_api.OLLAMA_VERSION})

    @endpoint
    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running")  # what Ollama clients probe for

    @endpoint
    async def load_or_unload(request: Request) -> Response:
        body = await read_json(request, max_body_bytes)
        name = body.get("model")
        if not isinstance(name, str):
            raise ApiError(400, 'expected {"model": NAME}', param="model")
        slot = router.slots.get(name)
        if slot is None:
            raise unknown(name)
        if request.url.path.endswith("/load"):
            await acquire(slot)
            router.release(slot)
        elif not await router.unload_idle(slot):
            busy = f"model {name} has {slot.in_flight} requests in flight"
            raise ApiError(409, busy, type="conflict_error")
        return JSONResponse({"model": name, "loaded": slot.loaded})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        reaper = asyncio.create_task(router.reap_idle())
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.to_thread(router.close)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        *(Route(path, relay, methods=["POST"]) for path in RELAYED),
    ]
    routes = [
        *with_unprefixed(routes),
        Route("/health", health, methods=["GET"]),
        Route("/models/load", load_or_unload, methods=["POST"]),
        Route("/models/unload", load_or_unload, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/pull", pull, methods=["POST"]),
        Route("/api/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        # a browser gets the chat page
        Route("/", page_or(root, needs_key=api_key is not None), methods=["GET", "HEAD"]),
        *asset_routes(),
    ]

    app = Starlette(routes=routes, lifespan=lifespan, **http_stack(host, cors_origins))
    app.router.redirect_slashes = False  # as the single-model server: no redirect built from Host
    return app
