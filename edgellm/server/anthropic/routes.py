"""Anthropic's Messages API on the shared front-end: /v1/messages (whole or streamed with Anthropic's
events) and /v1/messages/count_tokens.

The request becomes the OpenAI chat body the OpenAI routes parse (system, content blocks, tool_use and
tool_result blocks, tools, tool_choice, stop_sequences, sampling), so it is validated, constrained and
generated the same way (server/events.py). As Anthropic does, unknown top-level fields are a 400, and
errors come in its shape, `{"type": "error", "error": {"type", "message"}}`. The key may come as
`x-api-key` (what the SDK sends) or as a Bearer token.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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
from edgellm.server.http.errors import anthropic_error_body as error_body
from edgellm.server.http.errors import bad_value
from edgellm.server.protocol import parse_chat
from edgellm.server.thinking import can_switch_thinking
from edgellm.vision.prompt import MEDIA_MARKER

FIELDS = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "metadata", "thinking", "service_tier", "output_config",
    "context_overflow",  # edgellm's (server/context_overflow.py)
}  # fmt: skip
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}
OPENAI_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "response_format.json_schema.schema": "output_config.format.schema",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "reasoning_effort": "thinking",
    "thinking_budget_tokens": "thinking.budget_tokens",
    "chat_template_kwargs.enable_thinking": "thinking",
}


def thinking_blocks(reasoning: str | None) -> list[dict[str, Any]]:
    """The reply's reasoning as Anthropic's `thinking` content block (no signature: nothing to verify)."""
    return [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []


def _text(value: Any, where: str) -> str:
    """A string, or a list of text blocks (system prompts, tool results), as one string."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_value(where, "expected a string or a list of text blocks")
    parts = []
    for i, b in enumerate(value):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else None
            raise bad_value(f"{where}[{i}]", f"only text blocks are supported here, got {kind!r}")
        parts.append(b["text"])
    return "".join(parts)


def _blocks(content: list, where: str, texts: list[str]) -> Iterator[tuple[str, str | None, Any]]:
    """(where, type, block) of each content block but the text ones, whose text goes to `texts`."""
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        else:
            yield f"{where}[{j}]", kind, b


def _user(content: list, where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn's blocks: its tool results (OpenAI tool messages, first: they answer the calls just
    before) and its text (one user message)."""
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    images: list[str] = []  # data URLs, in order
    for at, kind, b in _blocks(content, where, texts):
        if kind == "tool_result":
            use_id = b.get("tool_use_id")
            if not isinstance(use_id, str):
                raise bad_value(f"{at}.tool_use_id", "expected the id of the tool_use block it answers")
            result = _text(b.get("content", ""), f"{at}.content")
            if b.get("is_error") is True:
                result = f"Error: {result}"
            msg = {"role": "tool", "tool_call_id": use_id, "content": result}
            tools.append({**msg, "name": names[use_id]} if use_id in names else msg)
        elif kind == "image":  # base64: the media marker where it stands (parse_chat takes the part)
            src = b.get("source")
            src = src if isinstance(src, dict) else {}
            if src.get("type") != "base64" or not isinstance(src.get("data"), str):
                raise bad_value(f"{at}.source", "only base64 image sources are supported")
            media = src.get("media_type") if isinstance(src.get("media_type"), str) else "image"
            images.append(f"data:{media};base64,{src['data']}")
            texts.append(MEDIA_MARKER)
        elif kind == "document":
            raise bad_value(at, f"{kind} blocks are not supported: the model reads text and images only")
        else:
            raise bad_value(at, f"unsupported content block {kind!r} (text, image, tool_result)")
    text = "".join(texts)
    if images:  # OpenAI parts: the text between markers, each image where its marker was
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) != len(images) + 1:
            raise bad_value(where, f"the text holds the media marker {MEDIA_MARKER!r} itself")
        content: Any = [{"type": "text", "text": pieces[0]}]
        for url, piece in zip(images, pieces[1:], strict=True):
            content += [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": piece}]
        return [*tools, {"role": "user", "content": content}]
    return tools + ([{"role": "user", "content": text}] if texts or not tools else [])


def _assistant(content: list, where: str, names: dict[str, str]) -> dict[str, Any]:
    texts: list[str] = []
    calls = []
    thoughts = []
    for at, kind, b in _blocks(content, where, texts):
        if kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_value(at, "expected a tool_use block with an 'id' and a 'name'")
            if not isinstance(b.get("input", {}), dict):
                raise bad_value(f"{at}.input", "expected an object")
            names[b["id"]] = b["name"]
            args = json.dumps(b.get("input", {}), ensure_ascii=False)
            calls.append(
                {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": args}}
            )
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            thoughts.append(b["thinking"])  # earlier reasoning: the template decides where it goes
        elif kind in ("thinking", "redacted_thinking"):
            pass  # encrypted (or empty): nothing a template can read
        else:
            raise bad_value(at, f"unsupported content block {kind!r} in an assistant turn (text, tool_use)")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if any(thoughts):
        msg["reasoning_content"] = "".join(thoughts)
    return msg


def _messages(body: dict) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_value("messages", "expected a non-empty list of messages")
    names: dict[str, str] = {}  # tool_use id -> the tool's name
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_value(f"{where}.role", "expected a message with role 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif not isinstance(content, list):
            raise bad_value(f"{where}.content", "expected a string or a list of content blocks")
        elif m["role"] == "user":
            out += _user(content, f"{where}.content", names)
        else:
            out.append(_assistant(content, f"{where}.content", names))
    return out


def _tools(body: dict, out: dict[str, Any]) -> None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_value("tools", "expected a list of tools")
        converted = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "input_schema" not in t:
                raise bad_value(
                    f"tools[{i}]", "expected a client tool {'name', 'description', 'input_schema'}"
                )
            fn = {"name": t.get("name"), "description": t.get("description"), "parameters": t["input_schema"]}
            converted.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
        out["tools"] = converted
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad_value("tool_choice", "expected {'type': 'auto' | 'any' | 'tool' | 'none'}")
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        out["tool_choice"] = {"any": "required"}.get(kind, kind)
    one_call = choice.get("disable_parallel_tool_use")
    if one_call is not None:
        if not isinstance(one_call, bool):
            raise bad_value("tool_choice.disable_parallel_tool_use", "expected a boolean")
        out["parallel_tool_calls"] = not one_call


def openai_body(
    body: dict, allowed: set[str], count_only: bool = False, can_switch_thinking: bool = True
) -> dict[str, Any]:
    """The OpenAI chat body. `thinking: {"type": "disabled"}` turns a thinking model's thinking off;
    `{"type": "enabled", "budget_tokens": N}` turns it on with at most N reasoning tokens (the chat
    route's `thinking_budget_tokens`; N must be below max_tokens, as Anthropic asks, and at least 1:
    Anthropic's 1,024 minimum is not kept, small models think briefly). Both ask nothing of a model that
    cannot switch its thinking (one that never thinks). A model whose template thinks answers with
    `thinking` blocks unasked, at the server's --reasoning-budget."""
    extra = sorted(set(body) - allowed)
    if extra:
        raise bad_value(extra[0], "unknown field (Extra inputs are not permitted)")
    if not count_only and body.get("max_tokens") is None:
        raise bad_value("max_tokens", "required")
    thinking = _thinking(body, count_only)
    keys = ("model", "max_tokens", "temperature", "top_p", "top_k", "stream", "context_overflow")
    out = {k: body[k] for k in keys if k in body}
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_value("metadata", "expected an object")
    if isinstance(metadata, dict) and metadata.get("user_id") is not None:
        out["user"] = metadata["user_id"]
    if thinking is not None and can_switch_thinking:
        if thinking == 0:
            out["reasoning_effort"] = "none"
        else:
            out["chat_template_kwargs"] = {"enable_thinking": True}
            out["thinking_budget_tokens"] = thinking
    _output_config(body, out)
    out["messages"] = _messages(body)
    _tools(body, out)
    return out


def _thinking(body: dict, count_only: bool) -> int | None:
    """The `thinking` field's reasoning budget: 0 for {"type": "disabled"}, N for {"type": "enabled",
    "budget_tokens": N}, None when not given."""
    thinking = body.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return 0
    if kind != "enabled":
        raise bad_value(
            "thinking", "expected {'type': 'enabled', 'budget_tokens': N} or {'type': 'disabled'}"
        )
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise bad_value("thinking.budget_tokens", f"expected a positive integer, got {budget!r}")
    max_tokens = body.get("max_tokens")
    if not count_only and isinstance(max_tokens, int) and budget >= max_tokens:
        raise bad_value("thinking.budget_tokens", f"{budget} must be less than max_tokens ({max_tokens})")
    return budget


def _output_config(body: dict, out: dict[str, Any]) -> None:
    """Structured outputs: `output_config.format` {"type": "json_schema", "schema"} constrains the reply
    as OpenAI's response_format does (the grammar path). `effort` has no per-request form here."""
    config = body.get("output_config")
    if config is None:
        return
    if not isinstance(config, dict):
        raise bad_value("output_config", "expected an object")
    unknown = sorted(k for k, v in config.items() if v is not None and k not in ("format", "effort"))
    if unknown:
        raise bad_value(f"output_config.{unknown[0]}", "unknown field (Extra inputs are not permitted)")
    if config.get("effort") is not None:
        raise bad_value("output_config.effort", "not supported: there is no per-request effort here")
    fmt = config.get("format")
    if fmt is None:
        return
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(schema, dict):
        raise bad_value("output_config.format", "expected {'type': 'json_schema', 'schema': {...}}")
    out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _usage(n_prompt: int, end: End | None, output_tokens: int) -> dict[str, int]:
    """Anthropic's usage: input_tokens are those computed, the prefix cache's as cache_read_input_tokens
    (it is automatic: nothing is ever written on request, cache_creation_input_tokens 0)."""
    cached = end.cached_tokens if end is not None else 0
    return {"input_tokens": n_prompt - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}  # fmt: skip


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stop(end: End) -> dict[str, Any]:
    reason = "stop_sequence" if end.stop_sequence is not None else STOP_REASONS.get(end.reason, "end_turn")
    return {"stop_reason": reason, "stop_sequence": end.stop_sequence}


class _Message:
    def __init__(self, model: str, n_prompt: int) -> None:
        self.id, self.model, self.n_prompt = f"msg_{secrets.token_hex(12)}", model, n_prompt

    def head(self, content: list[dict[str, Any]], stop: dict[str, Any], end: End | None) -> dict[str, Any]:
        usage = _usage(self.n_prompt, end, end.completion_tokens if end is not None else 0)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, **stop, "usage": usage}  # fmt: skip

    def whole(self, reply: Reply) -> Response:
        assert reply.end is not None
        content = thinking_blocks(reply.reasoning)
        if reply.content or not (reply.calls or reply.reasoning):  # as streamed: no empty block
            content.append({"type": "text", "text": reply.content})
        for c in reply.calls:
            try:
                args = json.loads(c.arguments or "{}")
            except ValueError:
                continue  # a call cut short by max_tokens (stop_reason says so)
            content.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": args})
        return JSONResponse(self.head(content, _stop(reply.end), reply.end))

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        none = {"stop_reason": None, "stop_sequence": None}
        yield _sse("message_start", {"message": self.head([], none, None)})
        index, open_kind = -1, None  # the content block being streamed

        def start(block: dict[str, Any]) -> list[str]:
            nonlocal index, open_kind
            out = [_sse("content_block_stop", {"index": index})] if open_kind is not None else []
            index, open_kind = index + 1, block["type"]
            return out + [_sse("content_block_start", {"index": index, "content_block": block})]

        async for e in events:
            if isinstance(e, Reasoning):
                if open_kind != "thinking":
                    for line in start({"type": "thinking", "thinking": "", "signature": ""}):
                        yield line
                delta = {"type": "thinking_delta", "thinking": e.text}
                yield _sse("content_block_delta", {"index": index, "delta": delta})
            elif isinstance(e, Text):
                if open_kind != "text":
                    for line in start({"type": "text", "text": ""}):
                        yield line
                yield _sse(
                    "content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": e.text}}
                )
            elif isinstance(e, CallStart):
                for line in start({"type": "tool_use", "id": _tool_id(e.id), "name": e.name, "input": {}}):
                    yield line
            elif isinstance(e, CallArgs):
                delta = {"type": "input_json_delta", "partial_json": e.arguments}
                yield _sse("content_block_delta", {"index": index, "delta": delta})
            elif isinstance(e, End):
                if open_kind is not None:
                    yield _sse("content_block_stop", {"index": index})
                usage = _usage(self.n_prompt, e, e.completion_tokens)
                yield _sse("message_delta", {"delta": _stop(e), "usage": usage})
                yield _sse("message_stop", {})


def anthropic_routes(front: Frontend) -> list[Route]:
    state = front.state
    endpoint = front.endpoint(error_body=error_body, x_api_key=True)

    async def parsed(request: Request, allowed: set[str], count_only: bool) -> tuple[Any, list[int]]:
        body = await front.read_json(request)
        with renamed(OPENAI_NAMES):
            chat_body = openai_body(body, allowed, count_only, can_switch_thinking(state))
            req = parse_chat(chat_body, state.llm.n_ctx, state.config.sampling_defaults)
            return req, await front.prompt_ids(req)

    @endpoint
    async def messages(request: Request) -> Response:
        req, ids = await parsed(request, FIELDS, count_only=False)
        message = _Message(state.model_name, len(ids))
        error_line = lambda e: _sse("error", {"error": error_body(e)["error"]})  # noqa: E731
        return await respond(
            front, request, req, ids, message.whole, message.stream, error_line, "text/event-stream"
        )

    @endpoint
    async def count_tokens(request: Request) -> Response:
        _, ids = await parsed(request, COUNT_FIELDS, count_only=True)
        return JSONResponse({"input_tokens": len(ids)})

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
