"""gpt-oss's harmony format on the chat side: the tool calls it writes, and the reasoning of earlier turns
handed back to a chat template.

A harmony tool call is an assistant message to a function on the commentary (or analysis) channel, its
text the arguments' JSON, ended by `<|call|>` (an end-of-generation token, so not in the text):

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"city": "Paris"}
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{"city": "Paris"}

(reasoning_harmony.py passes such a message to the answer as written; the first one of a reply has no
`<|start|>assistant`, the prompt ended with it). `parse_harmony_calls` reads them as llama.cpp's gpt-oss
parser does; `harmony_hold` tells a streaming parser where one may begin.

Clients send earlier assistant turns back with their reasoning (`reasoning_content` from vLLM and
llama.cpp, Anthropic `thinking` blocks, Ollama's `thinking`); `with_past_reasoning` gives it to the
template under both names templates read: `reasoning_content` (Qwen3's) and `thinking` (gpt-oss's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from edgellm.chat.reasoning import partial_tail
from edgellm.chat.reasoning_harmony import CHANNEL, END, MESSAGE, RECIPIENT, START, call_name

CALL = "<|call|>"
_SPACE = re.compile(r"\s*")
# Where a call's header may begin in the answer text: the header's first marker.
OPENERS = (START, CHANNEL, RECIPIENT)
# A header still without its `<|message|>` past this many characters is not one (headers are short).
MAX_HEADER = 256


def _header_at(text: str, at: int) -> tuple[str, int]:
    """("call" | "maybe" | "no", where the call's arguments begin) for the header that may start at
    text[at]: "maybe" while it is not all written yet."""
    head = text[at:]
    if START.startswith(head):
        return "maybe", -1
    skip = len(START) if head.startswith(START) else 0
    head = head[skip:]
    if CHANNEL.startswith(head) or RECIPIENT.startswith(head):
        return "maybe", -1
    if not head.startswith((CHANNEL, RECIPIENT)):
        return "no", -1
    end = head.find(MESSAGE)
    if end < 0:
        return ("maybe" if len(head) <= MAX_HEADER else "no"), -1
    if call_name(head[:end]) is None:
        return "no", -1
    return "call", at + skip + end + len(MESSAGE)


def _next_call(text: str, pos: int) -> tuple[int, int, str] | None:
    """(header start, arguments start, function name) of the first complete call header from pos."""
    while True:
        hits = [h for h in (text.find(m, pos) for m in OPENERS) if h >= 0]
        if not hits:
            return None
        at = min(hits)
        state, body = _header_at(text, at)
        if state == "call":
            header = text[at:body][: -len(MESSAGE)]
            header = header[len(START) :] if header.startswith(START) else header
            return at, body, call_name(header) or ""
        pos = at + 1


def parse_harmony_calls(text: str, names: Sequence[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """(the text left as content, the calls as (name, arguments JSON)), None when the text has no
    harmony call. As for the other formats (chat_tools.parse_tool_calls): a call to an unknown function,
    or arguments that are not a JSON object, make the whole text content, no calls; a reply cut short
    inside its last call keeps the calls before it. What follows a call's arguments (a later message's
    text) is content."""
    found = _next_call(text, 0)
    if found is None:
        return None
    known = set(names)
    decoder = json.JSONDecoder()
    content, calls, pos = [], [], 0
    while found is not None:
        at, body, name = found
        content.append(text[pos:at])
        if name not in known:
            return text, []
        try:
            args, pos = decoder.raw_decode(text, _SPACE.match(text, body).end())
        except ValueError:
            if calls and _next_call(text, body) is None:  # the last call, cut short: dropped
                pos = len(text)
                break
            return text, []
        if not isinstance(args, dict):
            return text, []
        calls.append((name, json.dumps(args, ensure_ascii=False)))
        pos = _SPACE.match(text, pos).end()
        for marker in (CALL, END):  # a call's end, when the model wrote it as text
            if text.startswith(marker, pos):
                pos += len(marker)
        found = _next_call(text, pos)
    content.append(text[pos:])
    return "".join(content).strip(), calls


def harmony_hold(text: str, start: int) -> tuple[int, bool]:
    """(how far text[start:] is surely not a harmony call's header, whether a call's header begins
    there): what a streaming parser may send as content, and whether to hold the rest."""
    pos = start
    while True:
        hits = [(text.find(m, pos), m) for m in OPENERS]
        hits = [h for h in hits if h[0] >= 0]
        if not hits:
            return max(pos, len(text) - max(partial_tail(text, m) for m in OPENERS)), False
        at, marker = min(hits)
        state, _ = _header_at(text, at)
        if state != "no":
            return at, state == "call"
        pos = at + len(marker)


def with_past_reasoning(messages: list[dict[str, Any]], harmony: bool) -> list[dict[str, Any]]:
    """Messages whose `reasoning_content` (an earlier turn's reasoning) is also their `thinking`, as
    gpt-oss's template reads it (llama.cpp copies it the same way). For a harmony template an assistant
    turn with tool calls and reasoning loses its content: that template renders the reasoning as the
    call's analysis message and refuses a turn with both."""
    out = []
    for m in messages:
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            m = {**m, "thinking": m.get("thinking") or reasoning}
            if harmony and m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out
