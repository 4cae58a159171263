"""The Starlette application: the OpenAI routes, /health, /metrics and (de)tokenize over one ServerState
(state.py), each wrapped by errors.py's endpoint. The other APIs (server/ollama/routes.py,
server/anthropic/routes.py, server/responses/routes.py, infill.py) add their routes on the same front-end.

The model loads on a background thread after the socket is up, so /health can answer 503 while it
loads; every model endpoint answers 503 until then too. The engine core runs in its own process (see
engine/core_process.py): if it dies, in-flight requests get an error, /health answers 503 with the reason,
and a new core is started; if that fails too, the server exits non-zero.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from edgellm.server.anthropic.routes import anthropic_routes
from edgellm.server.context_overflow import completion_overflow, render_within_context
from edgellm.server.embeddings import embeddings
from edgellm.server.events import Frontend
from edgellm.server.generate import generate
from edgellm.server.http.auth import has_api_key
from edgellm.server.http.compat import with_unprefixed
from edgellm.server.http.endpoint import endpoint, read_json
from edgellm.server.http.errors import ApiError
from edgellm.server.http.stack import http_stack
from edgellm.server.infill import completion_prompts, infill_routes
from edgellm.server.llama_native import native_routes
from edgellm.server.lora_routes import lora_routes
from edgellm.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgellm.server.ollama.routes import ollama_routes
from edgellm.server.protocol import GenerationRequest, constrain, parse_chat, parse_completion
from edgellm.server.request_fields import CHAT_FIELDS, COMPLETION_FIELDS, check_fields
from edgellm.server.rerank import rerank_routes
from edgellm.server.responses.routes import responses_routes
from edgellm.server.state import ServerState, image_prompt_ids, render_chat_prompt
from edgellm.server.thinking import reasoning_setup, thinking_options
from edgellm.server.webui import asset_routes

log = logging.getLogger("edgellm.server")


def _piece(raw: bytes) -> str | list[int]:
    """A token's piece as llama-server's /tokenize gives it: its text, or its bytes where they are not
    valid UTF-8 on their own (part of a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def build_app(state: ServerState, on_startup: Callable[[], None] | None = None) -> Starlette:
    limit = state.config.max_body_bytes
    started = str(int(time.time()))

    check_model = state.names.check

    async def prompt_ids(req: GenerationRequest) -> list[int]:
        """A parsed chat request's model checked, its grammar compiled, its prompt rendered (thinking on or
        off as asked) and its reply set to split off the reasoning; for the other APIs also a one-prompt
        completion request's, tokenized."""
        check_model(req.model)
        await constrain(req, (state.llm.tokenizer, state.llm.config.n_vocab))
        if req.messages is None:  # one prompt (checked in start_generation); with a suffix, FIM's
            assert req.prompts is not None and len(req.prompts) == 1
            completion_overflow(state, req)
            return (await completion_prompts(state, req))[0]
        template_kwargs, budget = thinking_options(state, req)
        tools = req.tools and req.tools.tools
        prompt = await render_within_context(state, req, tools, template_kwargs)
        reasoning_setup(state, req, prompt.text, budget)
        if req.images:  # the rendered text's media markers become the images (encoded off the loop)
            return await image_prompt_ids(state, prompt.text, req.images)
        return prompt.token_ids

    @endpoint(state)
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request, limit)
        if isinstance(body, dict):  # (parse_chat answers any other body)
            check_fields(body, CHAT_FIELDS)
        defaults = state.config.sampling_defaults
        req = parse_chat(body, state.llm.n_ctx, defaults)
        return await generate(state, request, req, [await prompt_ids(req)], chat=True)

    @endpoint(state)
    async def completions(request: Request) -> Response:
        body = await read_json(request, limit)
        if isinstance(body, dict):
            check_fields(body, COMPLETION_FIELDS)
        req = parse_completion(body, state.config.sampling_defaults)
        check_model(req.model)
        assert req.prompts is not None
        await constrain(req, (state.llm.tokenizer, state.llm.config.n_vocab))
        completion_overflow(state, req)
        return await generate(state, request, req, await completion_prompts(state, req), chat=False)

    @endpoint(state)
    async def create_embeddings(request: Request) -> Response:
        return await embeddings(state, request, await read_json(request, limit))

    def model_card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "edgellm",
            "max_model_len": state.llm.n_ctx,
            # what the model takes in (LM Studio's and vLLM's model cards say so): images with --mmproj
            "input_modalities": ["text", "image"] if state.llm.vision is not None else ["text"],
        }

    @endpoint(state)
    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(n) for n in state.names.listed]})

    @endpoint(state)
    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        if not name:  # /v1/models/ names no model
            msg = f"GET {request.url.path}: no model named (GET /v1/models lists them)"
            raise ApiError(404, msg, type="not_found_error", code="404")
        check_model(name)
        return JSONResponse(model_card(name if name in state.names.listed else state.model_name))

    def health_report() -> tuple[dict[str, Any], int]:
        if state.load_error is not None:
            return {"status": "error", "error": repr(state.load_error)}, 503
        if not state.ready.is_set():
            return {"status": "loading"}, 503
        if state.core_error is not None or not state.llm.healthy:
            reason = state.core_error or state.llm.error
            return {"status": "error", "error": reason, "restarting": True}, 503
        return {"status": "ok", "model": state.model_name, "core_pid": state.llm.core.pid}, 200

    async def health(request: Request) -> Response:
        body, status = health_report()
        key = state.config.api_key
        if key is not None and not has_api_key(request, key):
            body = {"status": body["status"]}  # the model, pid and errors only for those with the key
        return JSONResponse(body, status_code=status)

    @endpoint(state, auth=not state.config.metrics_public)
    async def metrics(request: Request) -> Response:
        text = state.metrics.render(state.llm.stats())
        headers = {"Process-Start-Time-Unix": started}  # llama-server's: a scraper sees restarts
        return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE, headers=headers)

    @endpoint(state)
    async def tokenize(request: Request) -> Response:
        body = await read_json(request, limit)
        tok = state.llm.tokenizer
        if "messages" in body:
            req = parse_chat({"messages": body["messages"]}, state.llm.n_ctx)
            assert req.messages is not None
            add_generation_prompt = body.get("add_generation_prompt", True)
            if not isinstance(add_generation_prompt, bool):
                raise ApiError(
                    400, "'add_generation_prompt' must be a boolean", param="add_generation_prompt"
                )
            rendered = await render_chat_prompt(
                state, req.messages, add_generation_prompt, for_generation=False
            )
            ids = rendered.token_ids
        else:
            text = body.get("content", body.get("prompt"))
            add_special = body.get("add_special", True)
            if not isinstance(text, str) or not isinstance(add_special, bool):
                raise ApiError(400, "expected 'content' (string) and optional 'add_special' (boolean)")
            ids = await state.off_loop(lambda: tok.encode(text, add_special=add_special))
        tokens: list[Any] = ids
        if body.get("with_pieces") is True:  # llama-server's form: each id with its piece
            pieces = lambda: [{"id": t, "piece": _piece(tok.token_bytes(t))} for t in ids]  # noqa: E731
            tokens = await state.off_loop(pieces)
        return JSONResponse({"tokens": tokens, "count": len(ids), "max_model_len": state.llm.n_ctx})

    @endpoint(state)
    async def detokenize(request: Request) -> Response:
        body = await read_json(request, limit)
        ids = body.get("tokens")
        vocab = state.llm.tokenizer.vocab_size
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ApiError(400, "'tokens' must be a list of token ids", param="tokens")
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"token ids must be in 0..{vocab - 1}", param="tokens")
        return JSONResponse({"content": await state.off_loop(state.llm.detokenize, ids)})

    @asynccontextmanager
    async def lifespan(app: Starlette):  # noqa: ANN202
        if on_startup is not None:
            on_startup()
        yield
        if state.llm is not None:
            state.llm.shutdown()
        state.work_pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", create_embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
    routes += rerank_routes(state, endpoint, lambda request: read_json(request, limit))
    front = Frontend(
        state, lambda request: read_json(request, limit), lambda **kw: endpoint(state, **kw), prompt_ids
    )
    routes += ollama_routes(front) + anthropic_routes(front) + responses_routes(front) + infill_routes(front)
    routes += native_routes(front) + lora_routes(front)
    routes += asset_routes()  # the chat page's scripts and style (the page itself: ollama_api's /)

    def count(e: ApiError) -> None:
        state.metrics.count_error(e.status)

    app = Starlette(
        routes=with_unprefixed(routes),
        **http_stack(state.config.host, state.config.cors_origins, count),
        lifespan=lifespan,
    )
    # No redirect from /metrics/ to /metrics: Starlette builds its Location from the Host header (an open
    # redirect) and answers it before any key check. Paths match exactly; others are 404s.
    app.router.redirect_slashes = False
    return app
