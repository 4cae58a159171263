"""The Starlette application: routes, API-key check, body limit, OpenAI-style errors, model loading. The
other APIs (ollama_api.py, anthropic_api.py, responses_api.py) add their routes on the same front-end.

The model loads on a background thread after the socket is up, so /health can answer 503 while it
loads; every model endpoint answers 503 until then too. The engine core runs in its own process (see
engine/core_process.py): if it dies, in-flight requests get an error, /health answers 503 with the reason,
and a new core is started; if that fails too, the server exits non-zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from edgellm.chat_template import ChatPrompt, ChatTemplate, ChatTemplateError
from edgellm.llm import LLM
from edgellm.reasoning import REASONING_FORMATS
from edgellm.sampling_defaults import check_sampling_defaults
from edgellm.server.anthropic_api import anthropic_routes
from edgellm.server.auth import check_api_key, check_api_key_option, has_api_key
from edgellm.server.compat import ModelNames, cors_middleware, with_unprefixed
from edgellm.server.embeddings import embeddings
from edgellm.server.frontend import Frontend
from edgellm.server.generate import generate
from edgellm.server.infill import completion_prompts, infill_routes
from edgellm.server.metrics import ServerMetrics
from edgellm.server.ollama_api import ollama_routes
from edgellm.server.protocol import (
    ApiError,
    GenerationRequest,
    check_unicode,
    constrain,
    parse_chat,
    parse_completion,
)
from edgellm.server.responses_api import responses_routes
from edgellm.server.thinking import reasoning_setup, thinking_options

log = logging.getLogger("edgellm.server")
DEFAULT_MAX_BODY_BYTES = 4 * 2**20


@dataclass
class ServerConfig:
    model: str
    backend: str = "cpu"
    ctx: int | None = None
    threads: int | None = None
    api_key: str | None = None
    max_queue: int = 64  # requests that may wait for a free slot beyond the running ones
    max_num_seqs: int = 16  # requests generated together
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of RAM (LLM's kv_cache_memory)
    kv_cache_dtype: str = "f16"  # LLM's kv_cache_dtype
    metrics_public: bool = False  # /metrics without the API key
    allow_special_in_content: bool = False  # parse control-token text typed in user/tool content
    chat_template_file: str | None = None  # instead of the GGUF's template
    served_model_names: tuple[str, ...] = ()  # names answered to (the first is reported); none: any name
    cors_origins: tuple[str, ...] = ()  # origins browsers may call from ("*": any); none: CORS off
    speculative: str | dict | None = None  # LLM's speculative ("ngram", "draft:PATH")
    num_speculative_tokens: int | None = None
    reasoning_format: str = "auto"  # edgellm.reasoning.REASONING_FORMATS
    reasoning_budget: int = -1  # reasoning tokens per reply: -1 unlimited, 0 no thinking
    # SamplingParams fields for requests that omit them (`serve --temperature ...`; sampling_defaults.py)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_api_key_option(self.api_key)
        check_sampling_defaults(self.sampling_defaults)
        if self.reasoning_format not in REASONING_FORMATS:
            choices = ", ".join(REASONING_FORMATS)
            raise ValueError(f"reasoning_format must be one of {choices}, got {self.reasoning_format!r}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be -1 (unlimited) or >= 0, got {self.reasoning_budget}")


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.names = ModelNames(config.model, config.served_model_names)
        self.model_name = self.names.primary
        self.metrics = ServerMetrics(self.model_name)
        self.llm: LLM = None  # type: ignore[assignment]  # set once loaded
        self.core_error: str | None = None  # why the engine core died, while a new one starts
        self.request_exit: Callable[[], None] = lambda: None  # set by run_server
        self.template: ChatTemplate | None = None
        self.template_error: str | None = None  # why chat requests cannot be served (broken template)
        # Templates render on their own threads: a slow one never blocks the event loop or other requests.
        self.template_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="edgellm-template")
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.in_flight = 0
        self.created = int(time.time())

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        try:
            c = self.config
            llm = LLM(
                c.model,
                backend=c.backend,
                n_ctx=c.ctx,
                threads=c.threads,
                max_num_seqs=c.max_num_seqs,
                kv_cache_memory=c.kv_cache_memory,
                kv_cache_dtype=c.kv_cache_dtype,
                progress=progress,
                speculative=c.speculative,
                num_speculative_tokens=c.num_speculative_tokens,
            )
            self.template, self.template_error = load_template(c, llm)
            llm.on_core_death = self._core_died
            self.llm = llm
            self.ready.set()
        except BaseException as e:
            self.load_error = e
            raise

    def _core_died(self, reason: str) -> None:
        """The engine core is gone (its requests have their errors): restart it on a helper thread."""
        log.error("%s; restarting the engine core", reason)
        self.core_error = reason

        def restart() -> None:
            try:
                self.llm.restart()
            except BaseException as e:  # noqa: BLE001 - no engine: the server stops, non-zero
                log.error("could not restart the engine core: %r", e)
                self.load_error = e
                self.request_exit()
                return
            self.core_error = None
            log.warning("engine core restarted")

        threading.Thread(target=restart, name="edgellm-core-restart", daemon=True).start()

    def admit(self, k: int) -> Callable[[], None]:
        """Reserve k request slots or raise 429; returns an idempotent release."""
        capacity = self.config.max_num_seqs + self.config.max_queue
        if self.in_flight + k > capacity:
            raise ApiError(
                429,
                f"the server is at capacity ({self.in_flight} requests in flight, "
                f"{self.config.max_num_seqs} running + {self.config.max_queue} queued at most); retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.in_flight += k
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= k

        return release


def load_template(config: ServerConfig, llm: LLM) -> tuple[ChatTemplate | None, str | None]:
    """The chat template, checked once with a plain conversation; a broken one is reported now and turns
    chat requests into 400s naming the problem, while completions keep working."""
    try:
        if config.chat_template_file is not None:
            source = Path(config.chat_template_file).read_text(encoding="utf-8")
            metadata = {**llm.metadata, "tokenizer.chat_template": source}
            template = ChatTemplate.from_metadata(metadata, llm.tokenizer)
            template.name = config.chat_template_file
        else:
            template = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
        template.check()
        return template, None
    except ChatTemplateError as e:
        print(f"edgellm: WARNING: {e}; chat requests will be refused", flush=True)
        log.warning("%s", e)
        return None, str(e)


class ErrorResponse(JSONResponse):
    """Error bodies as ASCII JSON: a message echoing client text (a lone surrogate, say) always encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(
    e: ApiError, state: ServerState | None = None, body: Callable[[ApiError], Any] | None = None
) -> JSONResponse:
    """The error as OpenAI's body, or as `body(e)` builds it for another API."""
    if state is not None:
        state.metrics.http_errors[e.status] += 1
    return ErrorResponse(e.body() if body is None else body(e), status_code=e.status, headers=e.headers)


async def render_chat_prompt(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> ChatPrompt:
    if state.template is None:
        raise ApiError(400, f"chat is unavailable: {state.template_error}", param="messages")
    render = state.template.render_prompt
    try:
        return await asyncio.get_running_loop().run_in_executor(
            state.template_pool,
            lambda: render(
                messages,
                state.llm.tokenizer,
                add_generation_prompt,
                allow_special_in_content=state.config.allow_special_in_content,
                tools=tools,
                template_kwargs=template_kwargs,
            ),
        )
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages") from None


Handler = Callable[[Request], Awaitable[Response]]


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

        return handler

    return wrap


async def read_json(request: Request, limit: int) -> dict[str, Any]:
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
    if size > limit:
        raise too_large
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    check_unicode(body)
    return body


def build_app(state: ServerState, on_startup: Callable[[], None] | None = None) -> Starlette:
    limit = state.config.max_body_bytes

    check_model = state.names.check

    async def prompt_ids(req: GenerationRequest) -> list[int]:
        """A parsed chat request's model checked, its grammar compiled, its prompt rendered (thinking on or
        off as asked) and its reply set to split off the reasoning; for the other APIs also a one-prompt
        completion request's, tokenized."""
        check_model(req.model)
        await constrain(req, (state.llm.tokenizer, state.llm.config.n_vocab))
        if req.messages is None:
            assert req.prompts is not None and len(req.prompts) == 1
            p = req.prompts[0]  # checked with the others in start_generation
            return state.llm.tokenize(p, add_special=True) if isinstance(p, str) else p
        template_kwargs, budget = thinking_options(state, req)
        tools = req.tools and req.tools.tools
        prompt = await render_chat_prompt(state, req.messages, tools=tools, template_kwargs=template_kwargs)
        reasoning_setup(state, req, prompt.text, budget)
        return prompt.token_ids

    @endpoint(state)
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request, limit)
        defaults = state.config.sampling_defaults
        req = parse_chat(body, state.llm.tokenizer.vocab_size, state.llm.n_ctx, defaults)
        return await generate(state, request, req, [await prompt_ids(req)], chat=True)

    @endpoint(state)
    async def completions(request: Request) -> Response:
        body = await read_json(request, limit)
        req = parse_completion(body, state.llm.tokenizer.vocab_size, state.config.sampling_defaults)
        check_model(req.model)
        assert req.prompts is not None
        await constrain(req, (state.llm.tokenizer, state.llm.config.n_vocab))
        return await generate(state, request, req, completion_prompts(state, req), chat=False)

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
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @endpoint(state)
    async def tokenize(request: Request) -> Response:
        body = await read_json(request, limit)
        tok = state.llm.tokenizer
        if "messages" in body:
            req = parse_chat({"messages": body["messages"]}, tok.vocab_size, state.llm.n_ctx)
            assert req.messages is not None
            add_generation_prompt = body.get("add_generation_prompt", True)
            if not isinstance(add_generation_prompt, bool):
                raise ApiError(
                    400, "'add_generation_prompt' must be a boolean", param="add_generation_prompt"
                )
            ids = (await render_chat_prompt(state, req.messages, add_generation_prompt)).token_ids
        else:
            text = body.get("content", body.get("prompt"))
            add_special = body.get("add_special", True)
            if not isinstance(text, str) or not isinstance(add_special, bool):
                raise ApiError(400, "expected 'content' (string) and optional 'add_special' (boolean)")
            ids = tok.encode(text, add_special=add_special)
        out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": state.llm.n_ctx}
        if body.get("with_pieces") is True:
            out["pieces"] = [tok.token_bytes(t).decode("utf-8", errors="replace") for t in ids]
        return JSONResponse(out)

    @endpoint(state)
    async def detokenize(request: Request) -> Response:
        body = await read_json(request, limit)
        ids = body.get("tokens")
        vocab = state.llm.tokenizer.vocab_size
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ApiError(400, "'tokens' must be a list of token ids", param="tokens")
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"token ids must be in 0..{vocab - 1}", param="tokens")
        return JSONResponse({"content": state.llm.detokenize(ids)})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ApiError(exc.status_code, msg, type=kind, code=str(exc.status_code)), state)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(ApiError(500, f"internal error: {exc!r}", type="server_error"), state)

    @asynccontextmanager
    async def lifespan(app: Starlette):  # noqa: ANN202
        if on_startup is not None:
            on_startup()
        yield
        if state.llm is not None:
            state.llm.shutdown()
        state.template_pool.shutdown(wait=False, cancel_futures=True)

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
    front = Frontend(
        state, lambda request: read_json(request, limit), lambda **kw: endpoint(state, **kw), prompt_ids
    )
    routes += ollama_routes(front) + anthropic_routes(front) + responses_routes(front) + infill_routes(front)
    app = Starlette(
        routes=with_unprefixed(routes),
        middleware=cors_middleware(state.config.cors_origins),
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    # No redirect from /metrics/ to /metrics: Starlette builds its Location from the Host header (an open
    # redirect) and answers it before any key check. Paths match exactly; others are 404s.
    app.router.redirect_slashes = False
    return app
