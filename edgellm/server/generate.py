"""The generation core every API goes through (start_generation: prompt checks, admission by the queue
limit, engine requests), and what /v1/chat/completions and /v1/completions make of it: OpenAI bodies, SSE
streaming, and aborting on client disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from edgellm.engine.core_client import EngineDeadError
from edgellm.engine.outputs import OutputCollector, RequestOutput
from edgellm.server.context_overflow import note_shifts
from edgellm.server.http.errors import ApiError, request_error
from edgellm.server.openai_format import (
    Choice,
    ResponseHead,
    completion_logprobs,
    new_id,
    reasoning_fields,
    sse,
    timings_of,
    usage,
)
from edgellm.server.openai_format import chat_logprobs as chat_lp
from edgellm.server.protocol import GenerationRequest
from edgellm.server.tools import ToolOutput

if TYPE_CHECKING:
    from edgellm.server.state import ServerState


class EngineStreamResponse(StreamingResponse):
    """A StreamingResponse that runs `on_close` however the response ends (finished, client gone,
    cancelled): the engine requests are aborted at once instead of whenever the generator is collected."""

    def __init__(
        self, content: AsyncIterator[str], on_close: Callable[[], None], media_type: str = "text/event-stream"
    ) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type=media_type, headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def _merge(gens: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several engine streams as they come; closing it cancels them all."""
    if len(gens) == 1:
        async for out in gens[0]:
            yield 0, out
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in g:
                q.put_nowait((i, out, None))
            q.put_nowait((i, None, None))
        except Exception as e:
            q.put_nowait((i, None, e))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            i, out, err = await q.get()
            if err is not None:
                raise err
            if out is None:
                remaining -= 1
            else:
                yield i, out
    finally:
        for t in tasks:
            t.cancel()


async def _until_disconnect(request: Request, coro: Any) -> Any:
    """Await coro, cancelling it if the client disconnects first (non-streaming requests)."""
    task = asyncio.ensure_future(coro)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task not in done:
        task.cancel()
        raise ApiError(499, "client disconnected")
    return task.result()


def engine_error(e: Exception) -> ApiError:
    if isinstance(e, EngineDeadError):
        return ApiError(503, str(e), type="server_error", code="engine_dead")
    return ApiError(400, str(e))


@dataclass
class Generation:
    """One API request's engine requests, admitted and started: `merged` yields (prompt index, output) as
    they come; `close` aborts what is still running and frees the slots (idempotent)."""

    head: ResponseHead
    merged: AsyncIterator[tuple[int, RequestOutput]]
    close: Callable[[], None]


async def encode_prompts(
    state: ServerState, prompts: list[str] | list[str | list[int]], chat: bool = False
) -> list[list[int]]:
    """Prompts as token ids (text with BOS as the model adds it), tokenized off the event loop; a text
    that cannot fit the context is refused by its size first, with the API's context-length 400."""
    try:
        return await state.off_loop(lambda: [state.llm.encode_prompt(p) for p in prompts])
    except ValueError as e:
        raise request_error(e, state.llm.n_ctx, chat) from None


def start_generation(
    state: ServerState, req: GenerationRequest, prompts: list[list[int]], chat: bool
) -> Generation:
    """The front-end's one way into the engine, for every API: each prompt's request checked once
    (LLM.make_request, before a slot is taken), admission (429 past the queue limit) and one engine stream
    per prompt."""
    head = ResponseHead(new_id("chatcmpl" if chat else "cmpl"), state.model_name, chat)
    try:
        requests = [
            state.llm.make_request(ids, req.params, f"{head.id}-{i}", group=head.id)
            for i, ids in enumerate(prompts)
        ]
    except ValueError as e:
        raise request_error(e, state.llm.n_ctx, chat) from None
    release = state.admit(len(prompts))
    rids = [r.request_id for r in requests]

    def close() -> None:
        state.llm.abort_all(rids)  # a no-op for requests that already finished
        release()

    try:
        gens = [state.llm.stream(r) for r in requests]
    except BaseException:
        close()
        raise
    return Generation(head, _merge(gens), close)


async def generate(
    state: ServerState, request: Request, req: GenerationRequest, prompts: list[list[int]], chat: bool
) -> Response:
    gen = start_generation(state, req, prompts, chat)
    head, merged, close = gen.head, gen.merged, gen.close
    n = req.params.n
    try:
        if not req.stream:
            try:
                return await _until_disconnect(request, _collect(state, req, head, merged, len(prompts) * n))
            finally:
                close()
        # Headers go out at once (a queued request must not leave its client without an answer); what the
        # engine could still reject was checked above, anything else is reported in-band.
        stream = _stream(state, req, head, None, merged, len(prompts) * n)
        return EngineStreamResponse(stream, close)
    except ApiError:
        close()
        raise
    except (ValueError, EngineDeadError) as e:
        close()
        raise engine_error(e) from e
    except BaseException:
        close()
        raise


async def _collect(
    state: ServerState, req: GenerationRequest, head: ResponseHead, merged: Any, num_choices: int
) -> JSONResponse:
    n = req.params.n
    collectors = [OutputCollector(n) for _ in range(num_choices // n)]  # one per prompt
    n_prompt = n_cached = 0
    metrics = None
    async for pi, out in merged:
        collectors[pi].push(out)
        if out.finished:
            n_prompt += out.metrics.num_prompt_tokens
            n_cached += out.metrics.num_cached_tokens
            note_shifts(req, out.metrics)
            metrics = out.metrics
            state.metrics.observe_request(out.metrics, collectors[pi].outputs[0].finish_reason or "stop")
    split = req.params.reasoning_split is not None
    choices = [
        Choice(
            text=o.text,
            num_tokens=len(o.token_ids),
            finish_reason=o.finish_reason,
            logprobs=o.logprobs or [],
            reasoning=o.reasoning if split else None,
        )
        for c in collectors
        for o in c.outputs
    ]
    if req.tools is not None:  # the text becomes content and tool calls
        for c in choices:
            out = ToolOutput(req.tools)
            out.text = c.text
            c.message, c.finish_reason = out.message(c.finish_reason)
    u = usage(n_prompt, sum(c.num_tokens for c in choices), n_cached, req.overflow_report)
    body = head.full(state.llm.tokenizer, choices, req.logprobs, u)
    if num_choices == 1 and metrics is not None:  # llama-server's timings, of its one request
        body["timings"] = timings_of(metrics, n_prompt, n_cached, choices[0].num_tokens)
    return JSONResponse(body)


async def _stream(
    state: ServerState,
    req: GenerationRequest,
    head: ResponseHead,
    first: tuple[int, RequestOutput] | None,
    merged: Any,
    num_choices: int,
) -> AsyncIterator[str]:
    tok = state.llm.tokenizer
    n = req.params.n
    with_usage = req.include_usage
    offsets = [0] * num_choices  # text offsets for legacy completion logprobs
    tool_outs = [ToolOutput(req.tools) for _ in range(num_choices)] if req.tools is not None else None

    def delta_chunk(idx: int, delta: dict[str, Any]) -> str:
        choice = {"index": idx, "delta": delta, "logprobs": None, "finish_reason": None}
        return sse(head.chunk([choice], with_usage))

    n_tokens = n_prompt = n_cached = 0
    try:
        if head.chat:  # OpenAI sends the role first, once per choice
            for i in range(num_choices):
                delta = {"role": "assistant", "content": "", "refusal": None}
                c = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                yield sse(head.chunk([c], with_usage))
        pending = [first] if first is not None else []
        while True:
            if pending:
                pi, out = pending.pop()
            else:
                try:
                    pi, out = await merged.__anext__()
                except StopAsyncIteration:
                    break
            for d in out.deltas:
                idx = pi * n + d.index
                n_tokens += len(d.token_ids)
                reason = d.finish_reason
                if d.reasoning:  # the think block's text, ahead of this step's answer text
                    yield delta_chunk(idx, reasoning_fields(d.reasoning))
                if tool_outs is not None:  # content and tool-call deltas instead of the raw text
                    for delta in tool_outs[idx].feed(d.text):
                        yield delta_chunk(idx, delta)
                    if reason is not None:
                        deltas, reason = tool_outs[idx].finish(reason)
                        for delta in deltas:
                            yield delta_chunk(idx, delta)
                elif d.text or d.logprobs:
                    yield sse(
                        head.chunk([_delta_choice(head, tok, idx, d, offsets, req.logprobs)], with_usage)
                    )
                    offsets[idx] += len(d.text)
                if reason is not None:
                    fin: dict[str, Any] = {"index": idx, "logprobs": None, "finish_reason": reason}
                    fin.update({"delta": {}} if head.chat else {"text": ""})
                    last = head.chunk([fin], with_usage)
                    if num_choices == 1 and out.finished:  # llama-server's timings, on its last chunk
                        m = out.metrics
                        last["timings"] = timings_of(m, m.num_prompt_tokens, m.num_cached_tokens, n_tokens)
                    yield sse(last)
            if out.finished:
                n_prompt += out.metrics.num_prompt_tokens
                n_cached += out.metrics.num_cached_tokens
                note_shifts(req, out.metrics)
                reason = next((d.finish_reason for d in out.deltas if d.finish_reason), None) or "stop"
                state.metrics.observe_request(out.metrics, reason)
        if with_usage:
            yield sse(head.usage_chunk(usage(n_prompt, n_tokens, n_cached, req.overflow_report)))
        yield sse("[DONE]")
    except (ValueError, EngineDeadError) as e:  # headers are out: report in-band as OpenAI does
        yield sse(engine_error(e).body())
    finally:
        await merged.aclose()


def _delta_choice(head: ResponseHead, tok: Any, idx: int, d: Any, offsets: list[int], want: bool) -> dict:
    if head.chat:
        lp = {"content": chat_lp(tok, d.logprobs or []), "refusal": None} if want else None
        return {"index": idx, "delta": {"content": d.text}, "logprobs": lp, "finish_reason": None}
    lp = completion_logprobs(tok, d.logprobs or [], offsets[idx]) if want else None
    return {"index": idx, "text": d.text, "logprobs": lp, "finish_reason": None}
