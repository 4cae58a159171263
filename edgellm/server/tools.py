"""OpenAI `response_format`, `tools`, `tool_choice` and `parallel_tool_calls`: request fields -> a grammar
for the engine and the tools for the chat template; the model's text -> OpenAI `tool_calls`, whole or
streamed as `delta.tool_calls` chunks.

How each `tool_choice` decodes:
- "none" (the default without tools): no tools reach the template; the reply is text.
- "auto" (the default with tools): free text; calls the model writes in a known format (edgellm.chat.tools)
  are parsed out of it. While streaming, text that may be the start of a call is held back until it is.
- "required": decoding is constrained to a JSON list of calls, `[{"name": ..., "arguments": {...}}]` (one
  call when `parallel_tool_calls` is false, at most `max_parallel_calls` otherwise), each call's arguments
  valid against its function's schema. A list cut short by max_tokens keeps its complete calls (the cut
  one is dropped) with finish_reason "length", as OpenAI reports a truncated reply; its JSON is never
  content.
- a named function: decoding is constrained to that function's arguments (its parameters schema); the
  whole output is the call's `arguments`, streamed as it comes.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from edgellm.chat.harmony import harmony_hold
from edgellm.chat.reasoning import partial_tail
from edgellm.chat.tools import HERMES_OPEN, ToolCall, complete_list_calls, could_start_call, parse_tool_calls
from edgellm.grammar.limits import check_schema
from edgellm.server.http.errors import bad_value

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ANY_OBJECT = {"type": "object"}
# OpenAI documents at most 128 tools; past these a request is refused before any of it is looked at.
MAX_TOOLS = 512
MAX_TOOLS_CHARS = 1 << 20  # the `tools` list as compact JSON
# Calls in one "required" reply unless the request's `max_parallel_calls` says otherwise: the grammar
# closes the list there. A small model at T=1 may otherwise add calls (often the same one again) until
# max_tokens, which is the whole context window when a request does not set it.
DEFAULT_MAX_PARALLEL_CALLS = 8


def parse_response_format(body: dict) -> dict[str, Any] | bool | None:
    """The JSON schema `response_format` asks for (True: any JSON object), or None for text."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise bad_value("response_format", "expected an object with a 'type'")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":  # llama-server's extension: a "schema" the object follows
        schema = rf.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise bad_value("response_format.schema", "expected a JSON Schema object")
        return True if schema is None else schema
    if kind != "json_schema":
        raise bad_value("response_format", f"type {kind!r} is not supported (text, json_object, json_schema)")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_value("response_format.json_schema", "expected an object with 'name' and 'schema'")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise bad_value("response_format.json_schema.name", "expected 1-64 letters, digits, '_' or '-'")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad_value("response_format.json_schema.strict", "expected a boolean")
    schema = spec.get("schema", _ANY_OBJECT)
    if not isinstance(schema, dict):
        raise bad_value("response_format.json_schema.schema", "expected a JSON Schema object")
    return schema


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]]  # OpenAI tool objects, as the template gets them
    choice: str  # "auto" | "required" | the name of the function that must be called
    parallel: bool
    max_calls: int = DEFAULT_MAX_PARALLEL_CALLS  # "required" with parallel calls: the list's maxItems

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def schema(self, name: str) -> dict[str, Any]:
        """The function's arguments schema. Arguments are what the function declares: an object schema
        that does not say otherwise gets additionalProperties false (as OpenAI's strict mode requires),
        or a small model pads its call with made-up keys."""
        fn = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        if schema.get("type") == "object" and "additionalProperties" not in schema:
            schema = {**schema, "additionalProperties": False}
        return schema

    def json_schema(self) -> dict[str, Any] | None:
        """What decoding is constrained to: None for "auto"."""
        if self.choice == "auto":
            return None
        if self.choice != "required":
            return self.schema(self.choice)
        return self.calls_schema()

    def calls_schema(self) -> dict[str, Any]:
        """A JSON list of calls to any of the tools. Each function's schema moves under the list's `$defs`
        as "<name>", its own `$defs`/`definitions` as "<name>.<def>", and its local `$ref`s are rewritten to
        match: a `$ref` means the same thing inside the combined schema as in the function's own."""
        defs: dict[str, Any] = {}
        calls = []
        for name in self.names:
            defs.update(_hoisted(name, self.schema(name)))
            calls.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/{name}"}},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1, "$defs": defs}
        array["maxItems"] = self.max_calls if self.parallel else 1
        return array


def _hoisted(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` and its top-level definitions as root `$defs` entries of a combined schema, every local
    `$ref` in them rewritten (a copy; an iterative walk, for schemas of any depth)."""
    own = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    out = {name: own}
    for key in ("$defs", "definitions"):
        table = schema.get(key)
        if isinstance(table, dict):
            out.update({f"{name}.{d}": sub for d, sub in table.items()})
    out = json.loads(json.dumps(out))  # a deep copy to rewrite in place
    todo: list[Any] = list(out.values())
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                node["$ref"] = _rebased(name, ref)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return out


def _rebased(name: str, ref: str) -> str:
    """A function schema's local pointer, pointed into the combined schema's `$defs`."""
    parts = ref[1:].split("/")  # "#/$defs/Unit/properties/x" -> ["", "$defs", "Unit", "properties", "x"]
    if len(parts) >= 3 and parts[1] in ("$defs", "definitions"):
        rest = "/".join(parts[3:])
        return f"#/$defs/{name}.{parts[2]}" + (f"/{rest}" if rest else "")
    return f"#/$defs/{name}{ref[1:]}"


def parse_tools(body: dict) -> ToolRequest | None:
    """`tools`/`tool_choice`/`parallel_tool_calls`; None when no tool may be called."""
    if body.get("functions") is not None or body.get("function_call") is not None:
        raise bad_value(
            "functions", "the deprecated 'functions'/'function_call' are not supported; use 'tools'"
        )
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_value("parallel_tool_calls", "expected a boolean")
    max_calls = body.get("max_parallel_calls")
    if max_calls is not None and (
        not isinstance(max_calls, int) or isinstance(max_calls, bool) or not 1 <= max_calls <= MAX_TOOLS
    ):
        raise bad_value("max_parallel_calls", f"expected an integer in [1, {MAX_TOOLS}]")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_value("tool_choice", "only allowed when 'tools' are given")
        return None
    if not isinstance(tools, list) or not tools:
        raise bad_value("tools", "expected a non-empty list of tools")
    if len(tools) > MAX_TOOLS:
        raise bad_value("tools", f"{len(tools)} tools; the limit is {MAX_TOOLS} (MAX_TOOLS)")
    size = len(json.dumps(tools, separators=(",", ":")))
    if size > MAX_TOOLS_CHARS:
        limit = f"the limit is {MAX_TOOLS_CHARS} (MAX_TOOLS_CHARS)"
        raise bad_value("tools", f"the tools are {size} characters of JSON; {limit}")
    checked, seen = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise bad_value(where, "expected {'type': 'function', 'function': {...}} (only function tools)")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_value(f"{where}.function.name", "expected 1-64 letters, digits, '_' or '-'")
        if name in seen:
            raise bad_value(f"{where}.function.name", f"duplicate function name {name!r}")
        seen.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad_value(f"{where}.function.description", "expected a string")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_value(f"{where}.function.parameters", "expected a JSON Schema object")
        checked.append({"type": "function", "function": fn})
    if choice is None or choice in ("auto", "required", "none"):
        choice = choice or "auto"
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        choice = choice["function"].get("name")
        if choice not in seen:
            raise bad_value("tool_choice", f"function {choice!r} is not among the tools")
    else:
        raise bad_value("tool_choice", "expected 'none', 'auto', 'required' or a {'function': {'name': ...}}")
    if choice == "none":
        return None
    max_calls = DEFAULT_MAX_PARALLEL_CALLS if max_calls is None else max_calls
    return ToolRequest(checked, choice, True if parallel is None else parallel, max_calls)


def checked_tool_schema(req: ToolRequest) -> dict[str, Any] | None:
    """What decoding is constrained to (None for "auto"), once every function's schema passed the limit
    and `$ref` loop checks, for "auto" too (nothing is compiled for it). GrammarError when one fails."""
    calls = req.calls_schema()
    check_schema(calls)
    return calls if req.choice == "required" else req.json_schema()


# ---- output ----------------------------------------------------------------------------------
def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _call_json(call: ToolCall, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "id": _call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class ToolOutput:
    """One choice's text -> content and tool calls, for a request with tools. `feed` takes each text
    delta and returns the chat `delta` objects to stream now; `finish` the rest and the finish reason."""

    def __init__(self, req: ToolRequest) -> None:
        self.req = req
        self.text = ""  # everything the model wrote
        self.sent = 0  # chars of text already streamed as content (auto) or arguments (named)
        self.held = False  # auto: the rest of the text is held back (a call may have begun)
        self.call_id: str | None = None  # named: the call's id once its header went out

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        choice = self.req.choice
        if choice == "required" or not text:
            return []
        if choice != "auto":  # named: the text is the arguments
            out = self._named_header() if self.call_id is None else []
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": self.text[self.sent :]}}]})
            self.sent = len(self.text)
            return out
        if self.held:
            return []
        if self.sent == 0 and could_start_call(self.text, self.req.names):
            return []  # a bare call would start here: wait
        at = self.text.find(HERMES_OPEN, self.sent)
        end = at if at >= 0 else len(self.text) - partial_tail(self.text, HERMES_OPEN)
        harmony_end, harmony_call = harmony_hold(self.text, self.sent)  # gpt-oss's call headers
        self.held = at >= 0 or harmony_call
        end = min(end, harmony_end)
        if end <= self.sent:
            return []
        out = [{"content": self.text[self.sent : end]}]
        self.sent = end
        return out

    def finish(self, reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        choice = self.req.choice
        if choice not in ("auto", "required"):  # named: the arguments are all out already
            out = [] if self.call_id is not None else self._named_header()
            return out, "length" if reason == "length" else "tool_calls"
        _, calls = self.result()
        rest = self.text[self.sent :] if choice == "auto" else ""  # "required": only calls, never text
        if calls:  # what is left of the text besides the calls (the text before a <tool_call> went out)
            rest = parse_tool_calls(rest, self.req.names)[0] if choice == "auto" else ""
        out = [{"content": rest}] if rest.strip() or (rest and not calls) else []
        out += [{"tool_calls": [_call_json(c, i)]} for i, c in enumerate(calls)]
        return out, "tool_calls" if calls and reason != "length" else reason

    def _named_header(self) -> list[dict[str, Any]]:
        self.call_id = _call_id()
        header = {"index": 0, "id": self.call_id, "type": "function"}
        return [{"tool_calls": [{**header, "function": {"name": self.req.choice, "arguments": ""}}]}]

    def result(self) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of the whole reply."""
        choice = self.req.choice
        if choice == "auto":
            content, calls = parse_tool_calls(self.text, self.req.names)
            return (content or None) if calls else self.text, calls
        if choice == "required":  # the grammar's list; cut short by max_tokens, its complete calls
            return None, complete_list_calls(self.text, self.req.names)
        return None, [ToolCall(choice, self.text)]

    def message(self, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The non-streaming message fields (content, tool_calls) and the finish reason."""
        content, calls = self.result()
        if not calls:
            return {"content": content}, reason
        tool_calls = [_call_json(c, i) for i, c in enumerate(calls)]
        for c in tool_calls:
            del c["index"]  # only stream chunks carry it
        final = "length" if reason == "length" else "tool_calls"
        return {"content": content, "tool_calls": tool_calls}, final
