"""What a chat request whose prompt does not fit the context window gets (`--context-overflow`, a
request's `context_overflow` field; docs/server.md):

- "error" (the default): the context-length 400, as llama.cpp answers.
- "truncate-middle": whole messages are dropped from the middle of the conversation, oldest first, until
  the prompt fits with room for the reply (max_tokens, at most a quarter of the context): the leading
  system messages, the first user turn and the latest turns stay whole, and the first user turn ends
  with MARKER saying how many messages were left out there. The cut starts the kept tail at an assistant
  message where it can, so user and assistant turns still alternate (strict templates refuse otherwise).
  The usage's `context_overflow` says what was dropped.
- "rolling-window": the reply may run past the context: the engine core shifts out the oldest tokens
  after the kept head (the rendered system messages) when the context fills (SamplingParams
  .context_shift_keep, Scheduler.shift_context); a prompt longer than the context is first cut the same
  way, by tokens. Only max_tokens ends the reply as "length".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgellm.server.http.errors import ApiError
from edgellm.server.state import render_chat_prompt, with_template
from edgellm.tokenizer import TextTooLongError

if TYPE_CHECKING:
    from edgellm.chat.template import ChatPrompt, ChatTemplate
    from edgellm.engine.outputs import RequestMetrics
    from edgellm.server.protocol import GenerationRequest
    from edgellm.server.state import ServerState

MARKER = "\n\n[... {n} earlier messages were left out here to fit the context window ...]"


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens a truncated prompt leaves for the reply: max_tokens, at most a quarter of the context."""
    return max(1, min(max_tokens, n_ctx // 4))


def tail_starts(messages: list[dict[str, Any]]) -> tuple[int, list[int]]:
    """(index of the first user message, the indices the kept tail may start at, fewest dropped first):
    after the first user turn, at an assistant message (turns keep alternating), and the last message
    itself as the last resort. A tool result never starts the tail (its call would be gone)."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first is None or first >= len(messages) - 1:
        return -1, []
    starts = [i for i in range(first + 2, len(messages)) if messages[i].get("role") == "assistant"]
    last = len(messages) - 1
    if messages[last].get("role") != "tool" and last not in starts:
        starts.append(last)
    return first, starts


def _marked(message: dict[str, Any], dropped: int) -> dict[str, Any]:
    note = MARKER.format(n=dropped)
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": note}]}
    return {**message, "content": (content or "") + note}


def cut_middle(messages: list[dict[str, Any]], first: int, start: int) -> list[dict[str, Any]]:
    """The conversation without messages[first + 1 : start], the first user turn marked."""
    dropped = start - first - 1
    return [*messages[:first], _marked(messages[first], dropped), *messages[start:]]


async def render_within_context(
    state: ServerState,
    req: GenerationRequest,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
) -> ChatPrompt:
    """The chat request's prompt, rendered; a prompt that does not fit the context handled by the
    request's overflow policy (the module's doc). Sets the request's overflow report and, for
    rolling-window, its params' context_shift_keep."""
    assert req.messages is not None
    policy = req.context_overflow or state.config.context_overflow
    n_ctx = state.llm.n_ctx
    messages = req.messages
    if policy == "rolling-window":
        prompt = await render_chat_prompt(state, messages, tools=tools, template_kwargs=template_kwargs,
                                          for_generation=False)  # fmt: skip
        keep = await _system_tokens(state, messages, prompt.token_ids, template_kwargs)
        req.params.context_shift_keep = keep
        ids = prompt.token_ids
        if len(ids) >= n_ctx:  # the oldest tokens after the head go, as the core's shift would
            room = reply_room(n_ctx, req.params.max_tokens)
            kept_tail = max(1, n_ctx - room - keep)
            req.overflow_report = {"policy": policy, "dropped_tokens": len(ids) - keep - kept_tail}
            ids = ids[:keep] + ids[len(ids) - kept_tail :]
        else:
            req.overflow_report = {"policy": policy, "dropped_tokens": 0}
        return prompt._replace(token_ids=ids)
    if policy != "truncate-middle":
        return await render_chat_prompt(state, messages, tools=tools, template_kwargs=template_kwargs)
    whole = await _render_or_none(state, messages, tools, template_kwargs, n_ctx - 1)
    if whole is not None:
        req.overflow_report = {"policy": policy, "dropped_messages": 0, "dropped_tokens": 0}
        return whole
    limit = n_ctx - reply_room(n_ctx, req.params.max_tokens)
    first, starts = tail_starts(messages)
    lo, hi, best = 0, len(starts) - 1, None
    while lo <= hi:  # the fewest dropped messages that fit: each later start drops more
        mid = (lo + hi) // 2
        fitted = await _render_or_none(state, cut_middle(messages, first, starts[mid]), tools,
                                       template_kwargs, limit)  # fmt: skip
        if fitted is None:
            lo = mid + 1
        else:
            best, hi = (starts[mid], fitted), mid - 1
    if best is None:  # even the head and the last message do not fit: the context-length 400
        return await render_chat_prompt(state, messages, tools=tools, template_kwargs=template_kwargs)
    start, fitted = best
    report: dict[str, Any] = {"policy": policy, "dropped_messages": start - first - 1}
    try:  # the whole conversation's count, unless its size alone says it is huge (not tokenized then)
        full = await with_template(state, _render(state, messages, True, tools, template_kwargs, 8 * n_ctx))
        report["dropped_tokens"] = len(full.token_ids) - len(fitted.token_ids)
    except TextTooLongError as e:
        report["dropped_tokens_at_least"] = e.num_tokens - len(fitted.token_ids)
    req.overflow_report = report
    return fitted


def _render(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    most: int | None = None,
) -> Callable[[ChatTemplate], ChatPrompt]:
    return lambda t: t.render_prompt(
        messages,
        state.llm.tokenizer,
        add_generation_prompt,
        allow_special_in_content=state.config.allow_special_in_content,
        tools=tools,
        template_kwargs=template_kwargs,
        max_tokens=most,
    )


async def _render_or_none(
    state: ServerState,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    most: int,
) -> ChatPrompt | None:
    """The rendered prompt if it has at most `most` tokens, else None (refused by its size untokenized
    where it surely has more); a template's error is its 400."""
    try:
        prompt = await with_template(state, _render(state, messages, True, tools, template_kwargs, most))
    except TextTooLongError:
        return None
    return prompt if len(prompt.token_ids) <= most else None


async def _system_tokens(
    state: ServerState, messages: list[dict[str, Any]], ids: list[int], template_kwargs: dict[str, Any]
) -> int:
    """How many leading prompt tokens a context shift keeps: those the leading system messages render
    to (their rendering alone shares them with the whole prompt), else the BOS."""
    n_system = next((i for i, m in enumerate(messages) if m.get("role") not in ("system", "developer")), 0)
    tok = state.llm.tokenizer
    bos = 1 if ids and tok.add_bos and tok.bos_id == ids[0] else 0
    if n_system == 0:
        return bos
    try:  # (a template may refuse a conversation of system messages alone)
        head = await with_template(state, _render(state, messages[:n_system], False, None, template_kwargs))
    except ApiError:
        return bos
    shared = 0
    for a, b in zip(head.token_ids, ids, strict=False):
        if a != b:
            break
        shared += 1
    return min(max(shared, bos), len(ids) - 1)


def completion_overflow(state: ServerState, req: GenerationRequest) -> None:
    """A completions request (a raw prompt: no messages to drop) under rolling-window generates past the
    context, keeping the BOS; a prompt longer than the context is still the 400 (its text is refused by
    its size before it is tokenized), under truncate-middle too."""
    if (req.context_overflow or state.config.context_overflow) == "rolling-window" and req.suffix is None:
        tok = state.llm.tokenizer
        req.params.context_shift_keep = 1 if tok.add_bos and tok.bos_id is not None else 0
        req.overflow_report = {"policy": "rolling-window", "dropped_tokens": 0}


def note_shifts(req: GenerationRequest, metrics: RequestMetrics) -> None:
    """Add a finished rolling-window request's shifted-out tokens (the engine core's count) to its
    usage report."""
    report = req.overflow_report
    if report is not None and report["policy"] == "rolling-window":
        report["shifted_tokens"] = report.get("shifted_tokens", 0) + metrics.num_shifted_tokens
