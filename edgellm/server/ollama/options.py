"""Ollama request fields -> the OpenAI chat body the shared front-end parses: `options`, `format`,
`keep_alive`, `think`, and the messages.

Ollama ignores options it does not know; here an option that would change the output and cannot be
honoured is a 400 naming it (docs/other_apis.md has the table):
- honoured: OPTION_FIELDS (temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
  presence_penalty, frequency_penalty);
- accepted, no effect on the output here: NO_OP_OPTIONS (where the model runs and how: threads, GPU
  layers, batch size, memory mapping...), `num_ctx` up to the server's --ctx (the server's window already
  holds it; nothing is ever truncated), and the samplers edgellm lacks at their "off" value (OFF_VALUES);
- anything else, or those samplers switched on: a 400.
"""

from __future__ import annotations

import json
from typing import Any

from edgellm.server.http.errors import ApiError, bad_value
from edgellm.server.protocol import _is_int, _is_number

OPTION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
NO_OP_OPTIONS = {
    "num_thread", "num_gpu", "main_gpu", "num_batch", "numa", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "embedding_only",
    "num_keep",  # what a context shift keeps: a rolling window (context_overflow) keeps the system prompt
    "penalize_newline",  # Ollama itself no longer applies it
}  # fmt: skip
# Samplers edgellm does not have, accepted at the value that turns them off.
OFF_VALUES: dict[str, float] = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
MIROSTAT_KNOBS = ("mirostat_tau", "mirostat_eta")  # no effect while mirostat is off
# `think` -> the OpenAI chat route's thinking fields: true turns thinking on at the server's
# --reasoning-budget, false off, a level is reasoning_effort's (with its budget: server/thinking.py).
THINK_EFFORTS: dict[bool | str, str] = {False: "none", "low": "low", "medium": "medium", "high": "high"}
THINK_VALUES = (True, *THINK_EFFORTS)


def bad(param: str, message: str) -> ApiError:
    return bad_value(param, message)


def opt_bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise bad(key, f"expected a boolean, got {type(v).__name__}")
    return v


def _options(body: dict) -> dict[str, Any]:
    """The request's options without those sent as null: a null option is unset, as Ollama (Go's
    pointers) reads it and as clients send every option they leave unset (langchain-ollama does)."""
    opts = body.get("options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise bad("options", "expected an object")
    return {k: v for k, v in opts.items() if v is not None}


def check_common(body: dict, n_ctx: int, embedding: bool = False) -> None:
    """The fields every generate/chat/embed request may carry: options (see the module's doc), keep_alive
    (accepted: the model stays loaded for the server's lifetime), think, logprobs."""
    keep = body.get("keep_alive")
    if keep is not None and not (isinstance(keep, str) or _is_number(keep)):
        raise bad("keep_alive", "expected a duration (a string such as '5m', or seconds)")
    think = body.get("think")
    if think is not None and not (isinstance(think, bool | str) and think in THINK_VALUES):
        raise bad("think", "expected true, false, 'low', 'medium' or 'high'")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise bad("logprobs", "logprobs are not supported on the Ollama routes (use /v1/chat/completions)")
    opts = _options(body)
    for key, value in opts.items():
        where = f"options.{key}"
        if key in NO_OP_OPTIONS or (embedding and (key in OPTION_FIELDS or key in OFF_VALUES)):
            continue
        if key == "num_ctx":
            if not _is_int(value) or value < 1:
                raise bad(where, "expected a positive integer")
            if value > n_ctx:
                raise bad(where, f"{value} is more than this server's context of {n_ctx} tokens (--ctx)")
        elif key in OFF_VALUES:
            if not _is_number(value) or value != OFF_VALUES[key]:
                raise bad(where, f"{key} is not supported (only {OFF_VALUES[key]}, off)")
        elif key in MIROSTAT_KNOBS:
            if opts.get("mirostat") not in (None, 0):
                raise bad("options.mirostat", "mirostat is not supported (only 0, off)")
            if not _is_number(value):
                raise bad(where, "expected a number")
        elif key == "repeat_last_n":
            # The repetition penalty looks at the whole context (Ollama's -1); another window changes it.
            if not _is_int(value):
                raise bad(where, "expected an integer")
            if value != -1 and opts.get("repeat_penalty") not in (None, 1, 1.0):
                raise bad(where, "only -1 (the whole context) is supported with repeat_penalty")
        elif key not in OPTION_FIELDS or embedding:
            raise bad(where, f"unknown option {key!r}")


def openai_fields(body: dict, n_ctx: int, can_switch_thinking: bool = True) -> dict[str, Any]:
    """model, options, format and think as OpenAI chat fields. `think: false` asks nothing of a model that
    cannot switch thinking off (one that never thinks, as Ollama takes it)."""
    out: dict[str, Any] = {}
    think = body.get("think")
    if think is True:
        out["chat_template_kwargs"] = {"enable_thinking": True}
    elif think is not None and (think is not False or can_switch_thinking):
        out["reasoning_effort"] = THINK_EFFORTS[think]
    model = body.get("model")
    if model is not None:
        out["model"] = model
    if body.get("context_overflow") is not None:  # edgellm's (server/context_overflow.py)
        out["context_overflow"] = body["context_overflow"]
    opts = _options(body)
    for key, field in OPTION_FIELDS.items():
        if opts.get(key) is not None:
            out[field] = opts[key]
    predict = out.get("max_tokens")
    if predict is None or predict in (-1, -2):  # Ollama: -1 until the model ends, -2 until the context fills
        out["max_tokens"] = n_ctx  # the context window caps it
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise bad("format", "expected 'json' or a JSON Schema object")
    return out


def _call_history(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's earlier calls, their arguments objects turned into the JSON text OpenAI's
    carry (parse_chat checks the rest)."""
    if not isinstance(calls, list):
        raise bad(where, "expected a list of tool calls")
    out = []
    for i, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        args = fn.get("arguments", {}) if isinstance(fn, dict) else None
        if not isinstance(args, dict):
            raise bad(
                f"{where}[{i}].function.arguments", "expected {'function': {'name', 'arguments': {...}}}"
            )
        call = {**fn, "arguments": json.dumps(args, ensure_ascii=False)}
        out.append({"id": f"call_{i}", "type": "function", "function": call})
    return out


def chat_messages(msgs: Any) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's (parse_chat checks roles and contents): images as image parts, an earlier
    reply's `thinking` as its `reasoning_content`, tool calls and `tool_name` renamed."""
    if not isinstance(msgs, list):
        raise bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "expected an object")
        msg = {k: m[k] for k in ("role", "content") if k in m}
        if m.get("images") not in (None, []):  # base64 images: OpenAI image parts, before the text
            images = m["images"]
            if not isinstance(images, list) or not all(isinstance(x, str) for x in images):
                raise bad(f"{where}.images", "expected a list of base64 strings")
            if not isinstance(msg.get("content", ""), str):
                raise bad(f"{where}.content", "expected a string")
            msg["content"] = [
                *({"type": "image_url", "image_url": {"url": "data:image;base64," + x}} for x in images),
                {"type": "text", "text": msg.get("content", "")},
            ]
        if m.get("role") == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _call_history(m["tool_calls"], f"{where}.tool_calls")
        if m.get("role") == "assistant" and m.get("thinking") is not None:
            msg["reasoning_content"] = m["thinking"]  # parse_chat checks it is a string
        if m.get("role") == "tool" and m.get("tool_name") is not None:
            if not isinstance(m["tool_name"], str):
                raise bad(f"{where}.tool_name", "expected a string")
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out
