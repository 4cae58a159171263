"""Ollama's native API on the shared front-end: /api/chat, /api/generate, /api/embed, /api/embeddings,
/api/tags, /api/show, /api/ps, /api/version, /api/pull, and its "Ollama is running" at /.

Requests are translated into the OpenAI chat (or completion) body the OpenAI routes parse, so they are
validated, constrained and generated the same way (server/events.py). Replies stream as NDJSON by default
(`stream` defaults to true, as Ollama's do); errors are Ollama's `{"error": "..."}`. The option table is in
server/ollama/options.py (docs/other_apis.md lists what is honoured, what is a documented no-op, and what is a
400).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edgellm.models.catalog import CATALOG, local_path
from edgellm.server.embeddings import embed
from edgellm.server.events import (
    CallArgs,
    CallStart,
    End,
    Event,
    Frontend,
    Reasoning,
    Reply,
    Text,
    renamed,
    respond,
)
from edgellm.server.http.errors import ApiError
from edgellm.server.http.errors import ollama_error_body as error_body
from edgellm.server.ollama.models import model_entry, pull_progress, show_body
from edgellm.server.ollama.options import bad, chat_messages, check_common, openai_fields, opt_bool
from edgellm.server.protocol import parse_chat, parse_completion
from edgellm.server.thinking import can_switch_thinking
from edgellm.server.webui import page_or

if TYPE_CHECKING:
    pass

# What /api/version reports: the Ollama release whose API this matches; VS Code's Copilot needs >= 0.6.4.
OLLAMA_VERSION = "0.6.4"
NDJSON = "application/x-ndjson"
UNSUPPORTED_GENERATE_FIELDS = {
    "template": "a template override",
    "context": "context (earlier token ids)",
    "images": "an image input",
}
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "abort": "stop"}


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def thinking_field(reasoning: str | None) -> dict[str, Any]:
    """The reply's reasoning as Ollama sends it (`message.thinking` on /api/chat, `thinking` on generate)."""
    return {"thinking": reasoning} if reasoning else {}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any] | None:
    """A call as Ollama sends it (arguments as an object); None for one cut short (not valid JSON)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return None
    return {"function": {"name": name, "arguments": args}}


def _stats(end: End) -> dict[str, Any]:
    """Ollama's counts and durations (nanoseconds, from the engine's timings)."""
    m = end.metrics
    arrived = finished = first = 0.0
    if m is not None and m.finished_time is not None:
        arrived, finished = m.arrival_time, m.finished_time
        first = m.first_token_time or finished
    return {
        "done_reason": DONE_REASONS.get(end.reason, end.reason),
        "total_duration": int((finished - arrived) * 1e9),
        "load_duration": 0,  # the model is loaded once, at start-up
        "prompt_eval_count": end.prompt_tokens,
        "prompt_eval_duration": int((first - arrived) * 1e9),
        "eval_count": end.completion_tokens,
        "eval_duration": int((finished - first) * 1e9),
    }


class ReplyShape:
    """Where the text goes: `message.content` for /api/chat, `response` for /api/generate."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat

    def piece(
        self, text: str, calls: list[dict[str, Any]] | None = None, thinking: str | None = None, **rest: Any
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text, **thinking_field(thinking)}
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out.update({"response": text, **thinking_field(thinking)})
        return {**out, **rest}

    def whole(self, reply: Reply) -> Response:
        assert reply.end is not None
        calls = [c for c in (_call(x.id, x.name, x.arguments) for x in reply.calls) if c is not None]
        return JSONResponse(self.piece(reply.content, calls, reply.reasoning, done=True, **_stats(reply.end)))

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        calls: dict[int, list[str]] = {}  # a call goes out whole, once its arguments are complete
        async for e in events:
            if isinstance(e, Text):
                yield _line(self.piece(e.text, done=False))
            elif isinstance(e, Reasoning):
                yield _line(self.piece("", thinking=e.text, done=False))
            elif isinstance(e, CallStart):
                calls[e.index] = [e.id, e.name, ""]
            elif isinstance(e, CallArgs):
                calls[e.index][2] += e.arguments
            elif isinstance(e, End):
                done = [c for c in (_call(*x) for x in calls.values()) if c is not None]
                if done:
                    yield _line(self.piece("", done, done=False))
                yield _line(self.piece("", done=True, **_stats(e)))


def _check_prompt_field(body: dict, key: str, what: str) -> None:
    if body.get(key) not in (None, "", []):
        raise bad(key, f"{what} is not supported on this server")


def _model_name(body: dict) -> str:
    name = body.get("model", body.get("name"))  # `name` in older clients
    if not isinstance(name, str) or not name:
        raise bad("model", "expected a model name")
    return name


def ollama_routes(front: Frontend) -> list[Route]:
    state = front.state
    endpoint = front.endpoint(error_body=error_body)

    async def run(request: Request, body: dict, openai_body: dict, chat: bool, as_chat: bool) -> Response:
        """Generate for the translated body (`chat`: through the template) and answer as /api/chat does
        (`as_chat`) or /api/generate."""
        stream = opt_bool(body, "stream")
        openai_body["stream"] = True if stream is None else stream
        n_ctx = state.llm.n_ctx
        with renamed(OPENAI_NAMES):
            if chat:
                req = parse_chat(openai_body, n_ctx, state.config.sampling_defaults)
            else:
                req = parse_completion(openai_body, state.config.sampling_defaults)
            ids = await front.prompt_ids(req)
        shape = ReplyShape(state.model_name, as_chat)
        return await respond(
            front,
            request,
            req,
            ids,
            shape.whole,
            shape.stream,
            lambda e: _line(error_body(e)),
            NDJSON,
        )

    @endpoint
    async def chat(request: Request) -> Response:
        body = await front.read_json(request)
        check_common(body, state.llm.n_ctx)
        openai_body = openai_fields(body, state.llm.n_ctx, can_switch_thinking(state))
        openai_body["messages"] = chat_messages(body.get("messages"))
        if body.get("tools") not in (None, []):  # the ollama client sends [] for none
            openai_body["tools"] = body["tools"]
        return await run(request, body, openai_body, chat=True, as_chat=True)

    @endpoint
    async def generate(request: Request) -> Response:
        body = await front.read_json(request)
        check_common(body, state.llm.n_ctx)
        for key, what in UNSUPPORTED_GENERATE_FIELDS.items():
            _check_prompt_field(body, key, what)
        prompt, system = body.get("prompt"), body.get("system")
        if prompt is not None and not isinstance(prompt, str):
            raise bad("prompt", "expected a string")
        if system is not None and not isinstance(system, str):
            raise bad("system", "expected a string")
        openai_body = openai_fields(body, state.llm.n_ctx, can_switch_thinking(state))
        if not prompt:  # Ollama's "load the model" request: it is loaded
            state.names.check(openai_body.get("model"))
            out = ReplyShape(state.model_name, chat=False).piece("", done=True, done_reason="load")
            if opt_bool(body, "stream") is False:
                return JSONResponse(out)
            return StreamingResponse(iter([_line(out)]), media_type=NDJSON)
        suffix = body.get("suffix")
        if suffix not in (None, ""):  # fill in the middle, with the model's FIM tokens (as /infill)
            if not isinstance(suffix, str):
                raise bad("suffix", "expected a string")
            if system:
                raise bad("system", "a fill-in-the-middle prompt takes no system prompt")
            openai_body.update(prompt=prompt, suffix=suffix)
            return await run(request, body, openai_body, chat=False, as_chat=False)
        if opt_bool(body, "raw"):
            if system:
                raise bad("system", "a raw prompt takes no system prompt (write it into the prompt)")
            if "reasoning_effort" in openai_body or "chat_template_kwargs" in openai_body:
                raise bad("think", "a raw prompt has no template to switch thinking on or off")
            openai_body["prompt"] = prompt
            return await run(request, body, openai_body, chat=False, as_chat=False)
        system_msgs = [{"role": "system", "content": system}] if system else []
        openai_body["messages"] = [*system_msgs, {"role": "user", "content": prompt}]
        return await run(request, body, openai_body, chat=True, as_chat=False)

    @endpoint
    async def api_embed(request: Request) -> Response:
        body = await front.read_json(request)
        check_common(body, state.llm.n_ctx, embedding=True)
        model = body.get("model")
        state.names.check(model if isinstance(model, str) else None)
        x = body.get("input")
        inputs = [x] if isinstance(x, str) else x
        if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) and s for s in inputs):
            raise bad("input", "expected a non-empty string or a list of non-empty strings")
        opt_bool(body, "truncate")  # true or false: inputs are never truncated; one too long is a 400
        dims = body.get("dimensions")
        if dims is not None and dims != state.llm.config.n_embd:
            raise bad("dimensions", f"this model's embeddings have {state.llm.config.n_embd} dimensions")
        timer = time.perf_counter_ns()
        vectors, n_tokens = await embed(state, request, inputs)
        return JSONResponse(
            {
                "model": state.model_name,
                "embeddings": [v.tolist() for v in vectors],
                "total_duration": time.perf_counter_ns() - timer,
                "load_duration": 0,
                "prompt_eval_count": n_tokens,
            }
        )

    @endpoint
    async def api_embeddings(request: Request) -> Response:  # the older, one-prompt form
        body = await front.read_json(request)
        check_common(body, state.llm.n_ctx, embedding=True)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise bad("prompt", "expected a non-empty string")
        model = body.get("model")
        state.names.check(model if isinstance(model, str) else None)
        vectors, _ = await embed(state, request, [prompt], param="prompt")
        return JSONResponse({"embedding": vectors[0].tolist()})

    @endpoint
    async def tags(request: Request) -> Response:
        return JSONResponse({"models": [model_entry(state, n) for n in state.names.listed]})

    @endpoint
    async def ps(request: Request) -> Response:
        never = "2318-01-01T00:00:00Z"  # loaded for the server's lifetime
        models = [
            {**model_entry(state, n), "expires_at": never, "size_vram": 0, "context_length": state.llm.n_ctx}
            for n in state.names.listed
        ]
        return JSONResponse({"models": models})

    @endpoint
    async def show(request: Request) -> Response:
        body = await front.read_json(request)
        state.names.check(_model_name(body))
        return JSONResponse(show_body(state))

    @endpoint
    async def pull(request: Request) -> Response:
        body = await front.read_json(request)
        name = _model_name(body)
        opt_bool(body, "insecure")
        stream = opt_bool(body, "stream")
        tag_free = name.removesuffix(":latest")
        if tag_free in state.names.listed or name in state.names.listed:
            path = state.llm.path  # the model this server serves
        elif tag_free in CATALOG and (here := local_path(CATALOG[tag_free])) is not None:
            path = here  # downloaded already (this server still serves its own model)
        elif tag_free in CATALOG:
            how = f"this server does not download: run `edgellm pull {tag_free}`"
            raise ApiError(404, f"model {name!r} is not downloaded; {how}", param="model")
        else:
            known = ", ".join(sorted(CATALOG))
            raise ApiError(404, f"model {name!r} not found (catalog models: {known})", param="model")
        if stream is False:
            return JSONResponse({"status": "success"})
        return StreamingResponse(iter([_line(step) for step in pull_progress(path)]), media_type=NDJSON)

    unloaded = front.endpoint(error_body=error_body, needs_model=False)  # the key, but no model needed

    @unloaded
    async def version(request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    @unloaded
    async def root(request: Request) -> Response:
        # Ollama's answer at /: clients (Page Assist, Enchanted) probe it to see a server is there.
        return PlainTextResponse("Ollama is running")

    return [
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/embed", api_embed, methods=["POST"]),
        Route("/api/embeddings", api_embeddings, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/pull", pull, methods=["POST"]),
        Route("/api/version", version, methods=["GET"]),
        # a browser gets the chat page
        Route("/", page_or(root, needs_key=front.state.config.api_key is not None), methods=["GET", "HEAD"]),
    ]


# OpenAI body fields -> the Ollama fields they came from, for error messages.
OPENAI_NAMES = {
    "max_tokens": "options.num_predict",
    "temperature": "options.temperature",
    "top_p": "options.top_p",
    "top_k": "options.top_k",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "stop": "options.stop",
    "repetition_penalty": "options.repeat_penalty",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
    "response_format": "format",
    "response_format.json_schema.schema": "format",
    "reasoning_effort": "think",
    "chat_template_kwargs.enable_thinking": "think",
}
