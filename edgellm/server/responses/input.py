"""OpenAI Responses request bodies -> the OpenAI chat body the shared front-end parses: `input` (a string or
items), `instructions`, function `tools`, `tool_choice`, `text.format`, `max_output_tokens`; and the bounded
in-memory store `previous_response_id` reads earlier conversations from.

Unknown fields, and known ones that would change the output and cannot be honoured (built-in tools,
`background`, `include` values other than INCLUDE_NO_EFFECT, files; images outside user messages), are 400s
naming them. input_image parts (data URLs) in user messages go to the chat route as image_url parts.
`reasoning.summary` returns the reasoning whole as the summary; `truncation: "auto"` drops the oldest
input items until the prompt fits (server/responses/routes.py). `reasoning.effort` goes to the template's
thinking switch as the chat route's `reasoning_effort`.
A `reasoning` input item (an earlier reply's, sent back) becomes the `reasoning_content` of the
assistant turn after it, as on the chat route, and the template decides where it goes (gpt-oss keeps a
tool call's analysis, Qwen3 the reasoning after the last question); encrypted reasoning, which no
template can read, is a 400.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from edgellm.server.http.errors import ApiError, bad_value

FIELDS = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "stream", "previous_response_id", "store", "metadata",
    "user",
    "reasoning", "truncation", "include", "service_tier", "prompt_cache_key", "safety_identifier",
    "background", "top_logprobs",
}  # fmt: skip
TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}
# OpenAI chat fields -> the Responses fields they came from, for error messages.
OPENAI_NAMES = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format",
    "response_format.json_schema.name": "text.format.name",
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.json_schema.strict": "text.format.strict",
    "messages": "input",
    "reasoning_effort": "reasoning.effort",
}
REASONING_KEYS = ("effort", "summary", "generate_summary")
# `include` values asking for data these responses never have: the reasoning is sent as plain text
# (nothing is encrypted, so there is no encrypted_content to add), and there are no built-in tools.
INCLUDE_NO_EFFECT = {
    "reasoning.encrypted_content", "code_interpreter_call.outputs", "computer_call_output.output.image_url",
    "file_search_call.results", "message.input_image.image_url", "web_search_call.action.sources",
    "web_search_call.results",
}  # fmt: skip
MAX_STORED = 256  # responses previous_response_id can name
MAX_STORED_CHARS = 32 * 2**20  # their conversations together, as JSON


@dataclass
class Stored:
    messages: list[dict[str, Any]]  # the conversation as OpenAI chat messages, the reply included
    response: dict[str, Any]  # the response object, as the client got it
    input_items: list[dict[str, Any]]  # the request's input items, with ids
    size: int  # JSON characters of the three


class ResponseStore:
    """The last responses made with `store` true, for `previous_response_id` and for GET/DELETE
    /v1/responses/{id} and its input_items: at most MAX_STORED of them and MAX_STORED_CHARS in all,
    oldest out first, in memory until the server restarts."""

    def __init__(self, max_items: int = MAX_STORED, max_chars: int = MAX_STORED_CHARS) -> None:
        self.items: OrderedDict[str, Stored] = OrderedDict()
        self.max_items, self.max_chars, self.chars = max_items, max_chars, 0

    def put(
        self,
        response_id: str,
        messages: list[dict[str, Any]],
        response: dict[str, Any] | None = None,
        input_items: list[dict[str, Any]] | None = None,
    ) -> None:
        response, input_items = response or {}, input_items or []
        size = len(json.dumps([messages, response, input_items], ensure_ascii=False))
        if size > self.max_chars:
            return  # too large to keep: naming it later is a 400 saying it is not kept
        self.items[response_id] = Stored(messages, response, input_items, size)
        self.chars += size
        while len(self.items) > self.max_items or self.chars > self.max_chars:
            _, dropped = self.items.popitem(last=False)
            self.chars -= dropped.size

    def _not_kept(self, response_id: str) -> str:
        return (
            f"no stored response {response_id!r} (this server keeps the last {self.max_items} responses "
            "made with store true, in memory, until it restarts)"
        )

    def get(self, response_id: str) -> list[dict[str, Any]]:
        found = self.items.get(response_id)
        if found is None:
            raise bad_value("previous_response_id", self._not_kept(response_id))
        self.items.move_to_end(response_id)
        return found.messages

    def find(self, response_id: str) -> Stored:
        """The stored response, or OpenAI's 404."""
        found = self.items.get(response_id)
        if found is None:
            raise ApiError(404, self._not_kept(response_id), type="invalid_request_error", code="not_found")
        return found

    def delete(self, response_id: str) -> None:
        self.chars -= self.find(response_id).size
        del self.items[response_id]


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_value(where, "expected a string or a list of content parts")
    parts = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in TEXT_PARTS:
            text = p.get("text", p.get("refusal"))
            if not isinstance(text, str):
                raise bad_value(f"{where}[{i}].text", "expected a string")
            parts.append(text)
        elif kind in ("input_image", "input_file", "input_audio"):
            raise bad_value(f"{where}[{i}]", f"{kind} is not supported here (input_image: in user messages)")
        else:
            raise bad_value(f"{where}[{i}]", f"unsupported content part {kind!r} (input_text, output_text)")
    return "".join(parts)


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user or system message's content: its text (as _text), or with input_image parts (a data URL in
    image_url) the chat route's parts, each image where it stands (parse_chat decodes it)."""
    if not (
        isinstance(content, list)
        and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content)
    ):
        return _text(content, where)
    parts: list[dict[str, Any]] = []
    for i, p in enumerate(content):
        if isinstance(p, dict) and p.get("type") == "input_image":
            url = p.get("image_url")
            if not isinstance(url, str) or not url.startswith("data:"):  # not fetched, nor a file_id
                raise bad_value(f"{where}[{i}].image_url", "expected a data URL (data:image/...;base64,...)")
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            parts.append({"type": "text", "text": _text([p], f"{where}[{i}]")})
    return parts


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its `reasoning_text` parts, else its summary's `summary_text` parts."""
    for field, part_type, sep in (("content", "reasoning_text", ""), ("summary", "summary_text", "\n\n")):
        parts = item.get(field) or []
        if not isinstance(parts, list):
            raise bad_value(f"{where}.{field}", "expected a list of parts")
        texts = []
        for i, p in enumerate(parts):
            if not (isinstance(p, dict) and p.get("type") == part_type and isinstance(p.get("text"), str)):
                raise bad_value(f"{where}.{field}[{i}]", f"expected a {part_type} part with a string 'text'")
            texts.append(p["text"])
        if texts:
            return sep.join(texts)
    if item.get("encrypted_content"):
        raise bad_value(f"{where}.encrypted_content", "encrypted reasoning is not supported (unreadable)")
    return ""


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as OpenAI chat messages (without the instructions)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_value("input", "expected a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> the function's name
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to

    def assistant_turn(new: bool) -> dict[str, Any]:
        """The assistant turn an item joins (a new one unless it continues the last), with the reasoning
        before it."""
        if new or not (out and out[-1]["role"] == "assistant"):
            out.append({"role": "assistant", "content": ""})
        msg = out[-1]
        if reasoning:
            msg["reasoning_content"] = msg.get("reasoning_content", "") + "".join(reasoning)
            reasoning.clear()
        return msg

    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_value(where, "expected an object")
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = _reasoning_text(item, where)
            if text:
                reasoning.append(text)
            continue
        role = item.get("role") if kind == "message" else "assistant" if kind == "function_call" else None
        if reasoning and role != "assistant":  # reasoning with no answer after it: a turn of its own
            assistant_turn(new=True)
        if kind == "message":
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_value(f"{where}.role", "expected 'user', 'system', 'developer' or 'assistant'")
            read = _text if role == "assistant" else _user_content
            content = read(item.get("content"), f"{where}.content")
            if role == "assistant":
                assistant_turn(new=True)["content"] = content
            else:
                out.append({"role": role, "content": content})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(args, str)):
                raise bad_value(
                    where, "expected a function_call with string 'call_id', 'name' and 'arguments'"
                )
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            assistant_turn(new=False).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_value(f"{where}.call_id", "expected the call_id of the function_call it answers")
            msg = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _text(item.get("output"), f"{where}.output"),
            }
            out.append({**msg, "name": names[call_id]} if call_id in names else msg)
        else:
            raise bad_value(f"{where}.type", f"unsupported item type {kind!r} (message, function_call, ...)")
    if reasoning:
        assistant_turn(new=True)
    return out


def _tools(body: dict, out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_value("tools", "expected a list of tools")
        converted = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else None
                raise bad_value(f"tools[{i}]", f"only function tools are supported, got {kind!r}")
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            converted.append({"type": "function", "function": fn})
        out["tools"] = converted or None
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise bad_value(
                "tool_choice", "expected 'auto', 'none', 'required' or {'type': 'function', 'name'}"
            )
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    if body.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = body["parallel_tool_calls"]


def _text_format(body: dict, out: dict[str, Any]) -> None:
    text = body.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise bad_value("text", "expected an object")
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise bad_value(f"text.{extra[0]}", "unknown field")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_value("text.verbosity", "only 'medium' is supported")
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise bad_value("text.format", "expected an object with a 'type'")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    else:
        out["response_format"] = {"type": fmt.get("type")}


def _refuse_unsupported(body: dict) -> None:
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise bad_value(extra[0], "unknown parameter")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad_value("reasoning", "expected an object")
    extra = sorted(k for k, v in (reasoning or {}).items() if k not in REASONING_KEYS and v is not None)
    if extra:
        raise bad_value(f"reasoning.{extra[0]}", f"not supported (only {', '.join(REASONING_KEYS)})")
    for key in ("summary", "generate_summary"):  # the summary is the reasoning itself, never shortened
        if (reasoning or {}).get(key) not in (None, "auto", "concise", "detailed"):
            raise bad_value(f"reasoning.{key}", "expected 'auto', 'concise' or 'detailed'")
    if body.get("truncation") not in (None, "disabled", "auto"):
        raise bad_value("truncation", "expected 'disabled' or 'auto'")
    if body.get("background") not in (None, False):
        raise bad_value("background", "background responses are not supported")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise bad_value("include", "expected a list of strings")
        for value in include:
            if value not in INCLUDE_NO_EFFECT:
                known = ", ".join(sorted(INCLUDE_NO_EFFECT))
                raise bad_value("include", f"{value!r} is not supported (supported: {known})")
    if body.get("top_logprobs") not in (None, 0):
        raise bad_value(
            "top_logprobs", "logprobs are not supported on /v1/responses (use /v1/chat/completions)"
        )
    for key in ("store",):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise bad_value(key, "expected a boolean")
    for key in ("metadata",):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise bad_value(key, "expected an object")


def openai_body(body: dict, store: ResponseStore) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat body, and the conversation to store with the reply (earlier turns included, the
    instructions not: as OpenAI does, they do not carry over to a later response)."""
    _refuse_unsupported(body)
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise bad_value("previous_response_id", "expected a string")
    if "input" not in body:
        raise bad_value("input", "required")
    conversation = (list(store.get(prev)) if prev is not None else []) + input_messages(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_value("instructions", "expected a string")
    system = [{"role": "system", "content": instructions}] if instructions else []
    out: dict[str, Any] = {"messages": system + conversation}
    for key in ("model", "temperature", "top_p", "stream", "user"):
        if key in body:
            out[key] = body[key]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        out["reasoning_effort"] = effort  # parse_chat checks it, and the template's switch honours it
    _tools(body, out)
    _text_format(body, out)
    return out, conversation
