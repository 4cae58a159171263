"""Tool calling on the template side: conversations with tools, tool calls and tool results made ready for
a chat template, and tool calls found in what a model wrote.

A template that handles tools itself (it renders the `tools` it is given, assistant `tool_calls` and
`role: "tool"` messages: `ChatTemplate.supports_tools` probes this once) gets them the way Hugging Face
templates expect: `tools` as the OpenAI list, each call's `function.arguments` as an object. A template
without tool support (SmolLM2's, Gemma 3's built-in one, ChatML) gets the Hermes / Qwen 2.5 convention
written into plain messages, the most widely trained-on format: the tool list and calling instructions
in the system message, each call as `<tool_call>{"name": ..., "arguments": ...}</tool_call>` in the
assistant's text, and tool results as a user turn of `<tool_response>...</tool_response>` blocks (a user
turn, so templates that insist on alternating user/assistant roles, like Gemma's, still render).

`parse_tool_calls(text, names)` finds calls in the formats models write: Hermes `<tool_call>` JSON, Llama 3
JSON (`{"name": ..., "parameters": ...}`, optionally after `<|python_tag|>`), and Gemma's Python-call
style (`[get_weather(city="Paris")]`, also inside a ```tool_code block), and gpt-oss's harmony messages to
a function (edgellm.chat.harmony). Only functions in `names` count.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from edgellm.chat.harmony import parse_harmony_calls

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_TOOL_CODE = re.compile(r"^```(?:tool_code|tool_call|python)?\s*\n(.*?)\n?```$", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_SPACE = re.compile(r"\s*")

# What the fallback adds to the system message (Qwen 2.5's wording, which Hermes-format models know).
_FALLBACK_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_FALLBACK_TOOLS_FOOTER = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class ToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def _arguments_object(arguments: Any) -> Any:
    """OpenAI sends arguments as JSON text; templates want the object (text that is not JSON stays text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def has_tool_content(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> bool:
    return bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template with tool support: each call as HF templates read it (`function.arguments`
    an object rather than OpenAI's JSON text)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                fn = c["function"]
                args = _arguments_object(fn.get("arguments", "{}"))
                fixed.append({**c, "function": {**fn, "arguments": args}})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def fallback_messages(messages: list[dict[str, Any]], tools: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Messages for a template without tool support, in the Hermes convention (see the module doc)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # consecutive results share one user turn
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
            continue
        if m.get("tool_calls"):
            parts = [content] if content else []
            for c in m["tool_calls"]:
                fn = c["function"]
                call = {"name": fn["name"], "arguments": _arguments_object(fn.get("arguments", "{}"))}
                parts.append(f"{HERMES_OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{HERMES_CLOSE}")
            m = {"role": role, "content": "\n".join(parts)}
        out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id", "name")})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        listing = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        text = f"{_FALLBACK_TOOLS_HEADER}{listing}\n{_FALLBACK_TOOLS_FOOTER}"
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


# ---- what the model wrote -> calls ------------------------------------------------------------
def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """(the text left as content, the calls) from a model's reply; no calls: (text, []). A reply cut
    short inside its last call (an unclosed `<tool_call>`, a JSON list that never closes) keeps the calls
    before it and drops the cut one: its half-written JSON is neither a call nor content."""
    known = set(names)
    harmony = parse_harmony_calls(text, names)
    if harmony is not None:
        return harmony[0], [ToolCall(*c) for c in harmony[1]]
    if HERMES_OPEN in text:
        calls = []
        bodies = _HERMES_CALL.findall(text)
        for i, body in enumerate(bodies):
            call = _json_call(body, known)
            if call is None:
                cut = i == len(bodies) - 1 and HERMES_CLOSE not in text[text.rindex(HERMES_OPEN) :]
                if cut and calls:
                    break
                return text, []
            calls.append(call)
        if calls:
            return _HERMES_CALL.sub("", text).strip(), calls
    stripped = text.strip()
    if stripped.startswith(_PYTHON_TAG):
        stripped = stripped[len(_PYTHON_TAG) :].strip()
    if stripped[:1] in "{[":
        calls = _json_calls(stripped, known) or complete_list_calls(stripped, known)
        if calls:
            return "", calls
    block = _TOOL_CODE.match(stripped)
    calls = _python_calls(block.group(1) if block else stripped, known)
    if calls:
        return "", calls
    return text, []


def _json_call(body: str, known: set[str]) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _call_from_object(obj, known)


def _call_from_object(obj: Any, known: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in known:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_calls(text: str, known: set[str]) -> list[ToolCall]:
    try:
        obj = json.loads(text)
    except ValueError:
        return []
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call_from_object(o, known) for o in items]
    return calls if calls and all(c is not None for c in calls) else []  # type: ignore[return-value]


def complete_list_calls(text: str, known: set[str] | Sequence[str]) -> list[ToolCall]:
    """The complete calls at the start of a JSON list of calls, `[{"name": ..., "arguments": ...}, ...`,
    whether or not the list was closed: what a reply cut short by max_tokens got to write. [] when an
    item is not a call to a known function."""
    known = set(known)
    at = _SPACE.match(text).end()
    if text[at : at + 1] != "[":
        return []
    decoder, calls, at = json.JSONDecoder(), [], at + 1
    while True:
        at = _SPACE.match(text, at).end()
        try:
            obj, at = decoder.raw_decode(text, at)
        except ValueError:  # the cut item, or the list's end
            return calls
        call = _call_from_object(obj, known)
        if call is None:
            return []
        calls.append(call)
        at = _SPACE.match(text, at).end()
        if text[at : at + 1] != ",":
            return calls
        at += 1


def _python_calls(text: str, known: set[str]) -> list[ToolCall]:
    """`f(a=1)`, `[f(a=1), g(b="x")]` or one call per line; keyword arguments with literal values only."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        nodes = tree.body.elts if isinstance(tree.body, ast.List | ast.Tuple) else [tree.body]
    except SyntaxError:
        try:
            nodes = [s.value for s in ast.parse(text.strip()).body if isinstance(s, ast.Expr)]
        except SyntaxError:
            return []
    calls = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in known):
            return []
        if node.args or any(k.arg is None for k in node.keywords):
            return []
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except ValueError:
            return []
        try:
            calls.append(ToolCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        except TypeError:  # a literal JSON cannot hold (bytes, a set, a complex number)
            return []
    return calls


def could_start_call(text: str, names: Sequence[str]) -> bool:
    """Whether a reply that begins with `text` may turn out to be a bare call (JSON or Python style):
    its content is then held back while streaming until the reply ends."""
    s = text.lstrip()
    if not s:
        return True
    if _PYTHON_TAG.startswith(s[: len(_PYTHON_TAG)]) or s.startswith(_PYTHON_TAG):
        return True
    if s[0] in "{[`":
        return True
    head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", s)
    if head is None:
        return False
    word = head.group()
    if head.end() == len(s):
        return any(n.startswith(word) for n in names)
    return word in names and s[head.end()] == "("
