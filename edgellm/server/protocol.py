"""OpenAI request bodies -> validated requests (SamplingParams and prompts); a bad field is an ApiError.

A known field of the wrong type or out of range is a 400 naming the field (the OpenAI routes first
refuse fields they do not take: request_fields.py). `null` counts as "not given" for every optional
field. Booleans are never accepted as numbers (Python's bool is an int; JSON's is not).
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from edgellm.grammar.compile import GrammarError, constrain_async
from edgellm.grammar.worker import default_pool
from edgellm.lora.choice import request_lora
from edgellm.sampling.sampler import MAX_SEED, PARAM_BOUNDS, SamplingParams
from edgellm.server.constraints import Constraint, parse_constraint
from edgellm.server.http.errors import ApiError, bad_value
from edgellm.server.thinking_fields import ThinkingAsk, parse_thinking
from edgellm.server.tools import ToolRequest, checked_tool_schema, parse_tools
from edgellm.vision.prompt import MEDIA_MARKER, decode_data_url

MAX_N = 16  # completions per request
MAX_TOP_LOGPROBS = 20
MAX_STOP = 16
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


OVERFLOW_POLICIES = ("error", "truncate-middle", "rolling-window")  # context_overflow.py applies them


def parse_overflow(body: dict) -> str | None:
    """A request's `context_overflow` (None: the server's --context-overflow)."""
    v = body.get("context_overflow")
    if v is not None and v not in OVERFLOW_POLICIES:
        raise bad_value("context_overflow", f"expected one of {', '.join(OVERFLOW_POLICIES)}, got {v!r}")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))  # huge ints overflow isfinite


def check_unicode(body: Any) -> None:
    """Every string (and key) of a parsed JSON body must be valid Unicode: JSON's \\ud800 escapes decode
    to lone surrogates, which no tokenizer or UTF-8 encoder accepts."""
    try:  # the common case at C speed (a 1.6 MB body would hold the event loop a second in the walk)
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, RecursionError, TypeError, ValueError):
        pass  # the walk below names where (or finds nothing)
    stack = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, where))
                stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                param = where.encode("ascii", "backslashreplace").decode() or "body"
                raise ApiError(
                    400,
                    f"'{param}': invalid Unicode: lone surrogate {value[e.start]!r} at position {e.start}",
                    param=param,
                    code="invalid_unicode",
                ) from None


def _int(body: dict, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise bad_value(key, f"expected an integer, got {type(v).__name__}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad_value(
            key,
            f"{v} is out of range [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]",
        )
    return v


def _number(body: dict, key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_number(v):
        raise bad_value(key, f"expected a number, got {type(v).__name__}")
    if v > hi or v < lo or (lo_open and v == lo):
        raise bad_value(key, f"{v} is out of range {'(' if lo_open else '['}{lo}, {hi}]")
    return float(v)


def _bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad_value(key, f"expected a boolean, got {type(v).__name__}")
    return v


def _str(body: dict, key: str) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_value(key, f"expected a string, got {type(v).__name__}")
    return v


@dataclass
class GenerationRequest:
    model: str | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: bool  # return logprobs (chat: content entries; completions: the legacy object)
    user: str | None
    messages: list[dict[str, Any]] | None = None  # chat
    prompts: list[str | list[int]] | None = None  # completions: one engine request per prompt
    tools: ToolRequest | None = None  # chat with tools that may be called
    # What the output is constrained to (constraints.py: response_format and the other servers' fields);
    # `constrain` compiles it (or the tools' calls) into `params` off the event loop.
    constraint: Constraint | None = None
    # What it asked of a thinking model (`reasoning_effort`, `chat_template_kwargs.enable_thinking`, a
    # reasoning budget): thinking.py's parse_thinking
    thinking: ThinkingAsk = ThinkingAsk()
    # A prompt longer than the context (context_overflow.py): the request's policy (None: the server's),
    # and what the policy dropped, for the usage (None: no policy ran)
    context_overflow: str | None = None
    overflow_report: dict[str, Any] | None = None
    # completions: the text after the gap the model fills in (`suffix`); each prompt is then the text before
    suffix: str | None = None
    # chat: the images of image_url parts, in order (each part is a media marker in its message's text)
    images: list[bytes] = field(default_factory=list)


def _common(
    body: dict,
    max_tokens_default: int,
    top_logprobs: int | None,
    defaults: Mapping[str, Any],
) -> tuple:
    model = _str(body, "model")
    max_tokens = _int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", lo=1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad_value("stop", "expected a string or a list of strings")
    if len(stop) > MAX_STOP or any(not s for s in stop):
        raise bad_value("stop", f"at most {MAX_STOP} non-empty strings")
    bias_raw = body.get("logit_bias")
    logit_bias: dict[int, float] | None = None
    if bias_raw is not None:
        if not isinstance(bias_raw, dict):
            raise bad_value("logit_bias", "expected an object mapping token ids to biases")
        logit_bias = {}
        for k, v in bias_raw.items():
            try:
                tid = int(k)
            except ValueError:
                raise bad_value("logit_bias", f"key {reprlib.repr(k)} is not a token id") from None
            # (whether it is in the vocabulary is the front-end's check: LLM.make_request)
            if not _is_number(v) or not -100 <= v <= 100:
                raise bad_value("logit_bias", f"bias for token {tid} must be a number in [-100, 100]")
            logit_bias[tid] = float(v)
    stream = _bool(body, "stream") or False
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_value("stream_options", "expected an object")
        if not stream:
            raise bad_value("stream_options", "only allowed when 'stream' is true")
        include_usage = _bool(options, "include_usage") or False
    top_k = _int(body, "top_k", lo=-1)
    repeat = _repeat_penalty(body)
    opt = {
        **{k: _number(body, k, *bounds) for k, bounds in PARAM_BOUNDS.items()},  # SamplingParams' bounds
        "seed": _int(body, "seed", lo=0, hi=MAX_SEED),
        "n": _int(body, "n", lo=1, hi=MAX_N),
        "top_k": None if top_k is None else max(top_k, 0),  # -1 means off, as in vLLM
        "min_tokens": _int(body, "min_tokens", lo=0),  # vLLM's; checked against max_tokens below
    }
    if repeat is not None:
        opt["repetition_penalty"] = repeat
    try:  # llama-server's per-request adapters (an unknown id: LLM.make_request's 400)
        lora = request_lora(body.get("lora"))
    except ValueError as e:
        raise bad_value("lora", str(e)) from None
    params = SamplingParams(
        lora=lora,
        max_tokens=max_tokens or max_tokens_default,
        stop=stop,
        logit_bias=logit_bias,
        logprobs=top_logprobs,
        **{**defaults, **{k: v for k, v in opt.items() if v is not None}},  # the request's own win
    )
    user = _str(body, "user")
    return model, params, stream, include_usage, user


def _n_probs(body: dict, logprobs_given: bool) -> int | None:
    """llama-server's `n_probs` (top alternatives per generated token), as OpenAI's logprobs fields."""
    n = _int(body, "n_probs", lo=0, hi=MAX_TOP_LOGPROBS)
    if n is not None and n > 0 and logprobs_given:
        raise bad_value("n_probs", "give n_probs or logprobs/top_logprobs, not both")
    return n or None  # 0: none, as llama-server's default


def _repeat_penalty(body: dict) -> float | None:
    """llama-server's spelling of repetition_penalty, `repeat_penalty`, with its `repeat_last_n` window:
    the penalty here looks at the whole context (llama-server's -1), so only -1 is taken (or any window
    while the penalty is off), as on the Ollama routes."""
    value = _number(body, "repeat_penalty", *PARAM_BOUNDS["repetition_penalty"])
    if value is not None and body.get("repetition_penalty") is not None:
        raise bad_value("repeat_penalty", "give repetition_penalty or repeat_penalty, not both")
    window = _int(body, "repeat_last_n", lo=-1)
    if window not in (None, -1) and value not in (None, 1.0):
        raise bad_value("repeat_last_n", "only -1 (the whole context) is supported with repeat_penalty")
    return value


async def constrain(req: GenerationRequest, vocab: tuple[Any, int]) -> None:
    """Check the request's tools and compile what decodes it is constrained to (response_format, or the
    calls of tool_choice "required"/named) in a grammar worker into its params, against the model's
    vocabulary `vocab` (tokenizer, n_vocab); all of it off the event loop."""
    c = req.constraint
    param = "tools" if req.tools is not None else c.param if c is not None else ""
    try:
        if req.tools is not None:
            c = Constraint("tools", json_schema=await default_pool().off_loop(checked_tool_schema, req.tools))
        if c is not None:
            await constrain_async(req.params, vocab, c.json_schema, c.grammar, c.regex)
    except GrammarError as e:
        prefix = "a function's parameters cannot constrain decoding: " if param == "tools" else ""
        raise bad_value(param, prefix + str(e)) from None


def _content_part(part: Any, where: str, images: list[bytes]) -> dict[str, Any]:
    """A text part as it is; an image part (image_url with a base64 data URL) as the media marker where
    it stands, its bytes appended to `images` (llama-server's order)."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        try:
            images.append(decode_data_url(url))
        except ValueError as e:
            raise bad_value(f"{where}.image_url", str(e)) from None
        return {"type": "media_marker", "text": MEDIA_MARKER}  # joined without newlines around it
    raise bad_value(where, "only text and image_url content parts are supported")


def _messages(body: dict, images: list[bytes] | None = None) -> list[dict[str, Any]]:
    images = [] if images is None else images
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_value("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_value(where, "expected an object")
        role = m.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad_value(
                f"{where}.role", f"expected one of {sorted(CHAT_ROLES)}, got {reprlib.repr(role)}"
            )
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            content = [_content_part(part, f"{where}.content", images) for part in content]
        elif not isinstance(content, str):
            raise bad_value(f"{where}.content", "expected a string or a list of content parts")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _history_tool_calls(m["tool_calls"], f"{where}.tool_calls")
        for key in ("reasoning_content", "reasoning") if role == "assistant" else ():
            if m.get(key) is not None:  # an earlier turn's reasoning, under either name we send it
                if not isinstance(m[key], str):
                    raise bad_value(f"{where}.{key}", "expected a string")
                msg.setdefault("reasoning_content", m[key])
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if m.get(key) is not None:
                    if not isinstance(m[key], str):
                        raise bad_value(f"{where}.{key}", "expected a string")
                    msg[key] = m[key]
        out.append(msg)
    return out


def _history_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's earlier tool calls, as OpenAI sends them back."""
    if not isinstance(calls, list):
        raise bad_value(where, "expected a list of tool calls")
    out = []
    for i, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_value(f"{where}[{i}]", "expected {'id', 'type', 'function': {'name', 'arguments'}}")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise bad_value(f"{where}[{i}].function.arguments", "expected a JSON string")
        call_id = c.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_value(f"{where}[{i}].id", "expected a string")
        out.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


def parse_chat(
    body: dict, n_ctx: int, defaults: Mapping[str, Any] = MappingProxyType({})
) -> GenerationRequest:
    """`defaults`: the server's sampling defaults (ServerConfig.sampling_defaults) for omitted fields."""
    body = _object(body)
    logprobs = _bool(body, "logprobs") or False
    top = _int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise bad_value("top_logprobs", "requires 'logprobs' to be true")
    n_probs = _n_probs(body, "logprobs" in body or "top_logprobs" in body)
    if n_probs is not None:  # llama-server's spelling: the chosen token's logprob and n_probs others
        logprobs, top = True, n_probs
    tools = parse_tools(body)
    constraint = parse_constraint(body)
    if tools is not None and constraint is not None:
        raise bad_value(constraint.param, "cannot be combined with tools (unless tool_choice is 'none')")
    top_or_none = (top or 0) if logprobs else None
    model, params, stream, include_usage, user = _common(body, n_ctx, top_or_none, defaults)
    thinking = parse_thinking(body, params.max_tokens)
    images: list[bytes] = []
    return GenerationRequest(
        model,
        params,
        stream,
        include_usage,
        logprobs,
        user,
        messages=_messages(body, images),
        images=images,
        tools=tools,
        constraint=constraint,
        thinking=thinking,
        context_overflow=parse_overflow(body),
    )


def parse_completion(body: dict, defaults: Mapping[str, Any] = MappingProxyType({})) -> GenerationRequest:
    body = _object(body)
    k = _int(body, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    n_probs = _n_probs(body, k is not None)
    k = k if n_probs is None else n_probs
    if _bool(body, "echo"):
        raise bad_value("echo", "echo is not supported")
    suffix = _str(body, "suffix") or None  # "" asks for no infill: a plain completion
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        raise bad_value("tools", "tools are only supported on /v1/chat/completions")
    constraint = parse_constraint(body)
    model, params, stream, include_usage, user = _common(body, 16, k, defaults)  # OpenAI: 16
    prompt = body.get("prompt")
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)
    ):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_value("prompt", "expected a string, a list of strings, token ids or lists of token ids")
    if len(prompts) * params.n > MAX_N:
        raise bad_value("prompt", f"at most {MAX_N} completions per request (prompts x n)")
    for p in prompts:  # (token ids outside the vocabulary: the front-end's check, LLM.make_request)
        if isinstance(p, list) and suffix is not None:
            raise bad_value("suffix", "needs a text prompt (the text before the gap), not token ids")
    return GenerationRequest(
        model,
        params,
        stream,
        include_usage,
        k is not None,
        user,
        prompts=prompts,
        constraint=constraint,
        suffix=suffix,
        context_overflow=parse_overflow(body),
    )
