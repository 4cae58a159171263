"""What the other APIs (Ollama's /api/*, Anthropic's /v1/messages, OpenAI's /v1/responses) share with the
OpenAI routes, so that each of them is a translation and a formatter, never a second copy of generation:

- each API's request becomes the OpenAI chat body `parse_chat` validates, so the same GenerationRequest
  (sampling bounds, tools, grammars) reaches the same `prompt_ids` (model check, grammar compile, template)
  and the same `start_generation` (prompt checks, admission, engine requests);
- the engine's output comes back as one API-neutral stream of events (`Text`, `CallStart`, `CallArgs`,
  `End`), tool calls already parsed by server/tools.py; each API formats these events as it streams, or
  folds them with `whole` into one `Reply` when it does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from edgellm.engine.core_client import EngineDeadError
from edgellm.engine.outputs import CompletionOutput, RequestMetrics
from edgellm.engine.protocol import TokenLogprob
from edgellm.server.generate import (
    EngineStreamResponse,
    Generation,
    _until_disconnect,
    engine_error,
    start_generation,
)
from edgellm.server.http.errors import ApiError
from edgellm.server.protocol import GenerationRequest
from edgellm.server.tools import ToolOutput

if TYPE_CHECKING:
    from edgellm.server.state import ServerState

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class Frontend:
    """The shared front-end as build_app makes it, handed to each API's routes."""

    state: ServerState
    read_json: Callable[[Request], Awaitable[dict[str, Any]]]  # the body limit, JSON and Unicode checks
    # endpoint(error_body=..., x_api_key=...): the key check, the loading check, ApiError -> the API's body
    endpoint: Callable[..., Callable[[Handler], Handler]]
    # A parsed request's prompt: its model checked, its grammar compiled, its messages rendered by the
    # template (a completion request: its one prompt tokenized).
    prompt_ids: Callable[[GenerationRequest], Awaitable[list[int]]]


@dataclass
class Text:
    text: str


@dataclass
class Probs:
    """The logprobs of the tokens whose text the next Text event carries (asked for with n_probs)."""

    tokens: list[TokenLogprob]


@dataclass
class Reasoning:
    text: str  # a piece of the reply's reasoning (the think block's text, split off by the front-end)


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    arguments: str  # a piece of the call's arguments JSON


@dataclass
class End:
    reason: str  # "stop" | "length" | "tool_calls" | "abort"
    stop_sequence: str | None  # the stop string that ended it, if one did
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    metrics: RequestMetrics | None = None  # the engine's timings
    token_ids: list[int] = field(default_factory=list)  # the completion's generated ids


Event = Text | Probs | Reasoning | CallStart | CallArgs | End


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""  # JSON text


@dataclass
class Reply:
    """One whole completion."""

    content: str = ""
    calls: list[Call] = field(default_factory=list)
    end: End | None = None
    reasoning: str | None = None  # the reasoning split off the answer, when the reply had any
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, when asked for


@contextmanager
def renamed(names: dict[str, str]) -> Iterator[None]:
    """ApiErrors raised about the OpenAI body an API's request was translated to, renamed to the field the
    client sent ({"max_tokens": "options.num_predict"})."""
    try:
        yield
    except ApiError as e:
        new = names.get(e.param or "")
        if new is not None:
            e.message = e.message.replace(f"'{e.param}'", f"'{new}'", 1)
            e.param = new
        raise


def _neutral(delta: dict[str, Any]) -> Iterator[Event]:
    """One OpenAI chat delta of ToolOutput's ({"content"} or {"tool_calls": [...]}) as events."""
    if delta.get("content"):
        yield Text(delta["content"])
    for call in delta.get("tool_calls") or ():
        fn = call.get("function", {})
        if "id" in call:
            yield CallStart(call["index"], call["id"], fn.get("name", ""))
        if fn.get("arguments"):
            yield CallArgs(call["index"], fn["arguments"])


def matched_stop(state: ServerState, text: str, token_ids: list[int], stops: list[str]) -> str | None:
    """Which stop string ended a completion that finished "stop": in the tokens' text the answer returned
    runs on into it (an end-of-generation token instead leaves no stop string there)."""
    if not stops:
        return None
    full = state.llm.detokenize(token_ids)  # the reasoning's markup and text too, when it split
    return next((s for s in stops if text + s in full), None)


async def events(state: ServerState, req: GenerationRequest, gen: Generation) -> AsyncIterator[Event]:
    """The engine's output for a one-completion request as events, tool calls parsed when it has tools."""
    tools = ToolOutput(req.tools) if req.tools is not None else None
    whole = CompletionOutput.empty(0)
    reason = None
    n_prompt = n_cached = 0
    metrics = None
    async for _, out in _closing(gen.merged):
        for d in out.deltas:
            whole.add(d)
            if d.logprobs:
                yield Probs(d.logprobs)
            if d.reasoning:  # the think block's text, ahead of this step's answer text
                yield Reasoning(d.reasoning)
            deltas = tools.feed(d.text) if tools is not None else [{"content": d.text}]
            if d.finish_reason is not None:
                reason = d.finish_reason
                if tools is not None:
                    more, reason = tools.finish(reason)
                    deltas += more
            for delta in deltas:
                for event in _neutral(delta):
                    yield event
        if out.finished:
            n_prompt += out.metrics.num_prompt_tokens
            n_cached += out.metrics.num_cached_tokens
            state.metrics.observe_request(out.metrics, reason or "stop")
            metrics = out.metrics
    reason = reason or "stop"
    stop = matched_stop(state, whole.text, whole.token_ids, req.params.stop) if reason == "stop" else None
    yield End(reason, stop, n_prompt, len(whole.token_ids), n_cached, metrics, list(whole.token_ids))


async def _closing(merged: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        async for item in merged:
            yield item
    finally:
        await merged.aclose()  # type: ignore[attr-defined]


async def whole(stream: AsyncIterator[Event]) -> Reply:
    reply = Reply()
    async for e in stream:
        if isinstance(e, Text):
            reply.content += e.text
        elif isinstance(e, Probs):
            reply.logprobs += e.tokens
        elif isinstance(e, Reasoning):
            reply.reasoning = (reply.reasoning or "") + e.text
        elif isinstance(e, CallStart):
            reply.calls.append(Call(e.id, e.name))
        elif isinstance(e, CallArgs):
            reply.calls[e.index].arguments += e.arguments
        else:
            reply.end = e
    return reply


async def respond(
    front: Frontend,
    request: Request,
    req: GenerationRequest,
    prompt_ids: list[int],
    full: Callable[[Reply], Response],
    stream: Callable[[AsyncIterator[Event]], AsyncIterator[str]],
    error_line: Callable[[ApiError], str],
    media_type: str,
    chat: bool = True,
) -> Response:
    """Generate for one prompt: `full(reply)` when the request does not stream; else `stream(events)`'s
    lines, sent as they come (headers at once), an error once they are out as `error_line(error)`.
    `chat`: the prompt came from messages (errors about it name `messages`, else `prompt`)."""
    state = front.state
    gen = start_generation(state, req, [prompt_ids], chat=chat)
    try:
        if not req.stream:
            try:
                reply = await _until_disconnect(request, whole(events(state, req, gen)))
            finally:
                gen.close()
            return full(reply)
        lines = _reporting(stream(events(state, req, gen)), error_line)
        return EngineStreamResponse(lines, gen.close, media_type)
    except (ValueError, EngineDeadError) as e:
        gen.close()
        raise engine_error(e) from e
    except BaseException:
        gen.close()
        raise


async def _reporting(lines: AsyncIterator[str], error_line: Callable[[ApiError], str]) -> AsyncIterator[str]:
    try:
        async for line in lines:
            yield line
    except (ValueError, EngineDeadError) as e:  # headers are out: reported in-band
        yield error_line(engine_error(e))
