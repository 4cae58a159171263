"""The reasoning split of OpenAI's harmony format (gpt-oss): a reply is a run of messages, each
`<|channel|>NAME<|message|>TEXT` ended by `<|end|>` and the next one opened by `<|start|>assistant`;
the last, on the "final" channel, ends the generation (its `<|return|>` is an end-of-generation token, not
text). As llama.cpp's gpt-oss parser (common/chat-parser, parsers/gpt-oss.cpp) reads it:

    <|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER

- "analysis" messages are reasoning; "final" and "commentary" (preamble) messages are answer text;
- a stray `<|channel|>commentary` (optionally ` to=assistant`) before a channel header is dropped, as
  llama.cpp drops it;
- a tool call, a message to a function on the analysis or commentary channel, with the recipient after
  the channel or before it (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`,
  ` to=functions.NAME<|channel|>commentary json<|message|>ARGS`), stays in the answer as written, header
  included, up to the next message, for the tool-call parser (chat/harmony.py) to read;
- any other message addressed to a recipient, and anything that is not a harmony message, make the rest
  of the reply answer text as written, markers included;
- the markers themselves are in neither text otherwise.

The generation prompt ends with `<|start|>assistant`, so a reply starts at a channel header; one that
repeats `<|start|>assistant` first is read the same way.
"""

from __future__ import annotations

import re

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>assistant"
ANALYSIS_OPEN = CHANNEL + "analysis" + MESSAGE  # what opens the reasoning
# what a reasoning budget forces: the analysis message closed and the final one opened
HARMONY_REASONING_END = END + START + CHANNEL + "final" + MESSAGE
STRAY = (CHANNEL + "commentary to=assistant", CHANNEL + "commentary")
# channel -> where its text goes
CHANNEL_ROLE = {"analysis": "reasoning", "final": "answer", "commentary": "answer"}
RECIPIENT = " to=functions."  # what addresses a message to a function: a tool call
# A tool call's header (the text between `<|start|>assistant` and `<|message|>`), both orders, as
# llama.cpp's gpt-oss parser matches it: group 1 is the function's name.
_CONSTRAINT = r"(?: (?:<\|constrain\|>)?[A-Za-z0-9_-]+)?"
_NAME = r"([^<\s]+)"
CALL_HEADERS = (
    re.compile(rf" to=functions\.{_NAME}<\|channel\|>(?:analysis|commentary){_CONSTRAINT}"),
    re.compile(rf"<\|channel\|>(?:analysis|commentary) to=functions\.{_NAME}{_CONSTRAINT}"),
)


def call_name(header: str) -> str | None:
    """The function a message header addresses, when it is a tool call's header; else None."""
    for pattern in CALL_HEADERS:
        m = pattern.fullmatch(header)
        if m is not None:
            return m.group(1)
    return None


def _partial_tail(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class HarmonySplitter:
    """One completion's emitted text -> (reasoning delta, answer delta), harmony's way (module doc). Text
    that may be the start of a marker is held back until it is known (or the completion ends)."""

    def __init__(self) -> None:
        self.state = "header"  # header -> (reasoning | answer | call) -> header ...; "raw": pass everything
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning, answer = [], []
        while True:
            if self.state == "raw":
                answer.append(self.buf)
                self.buf = ""
                break
            if self.state == "header":
                if not self._header(final, answer):
                    break
                continue
            if self.state == "call":  # a call's arguments, as written, up to the next message's start
                at = self.buf.find(START)
                if at >= 0:
                    answer.append(self.buf[:at])
                    self.buf, self.state = self.buf[at:], "header"
                    continue
                keep = 0 if final else _partial_tail(self.buf, START)
                answer.append(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                break
            # in a message's text: up to <|end|>, a partial <|end|> held back
            at = self.buf.find(END)
            out = reasoning if self.state == "reasoning" else answer
            if at >= 0:
                out.append(self.buf[:at])
                self.buf, self.state = self.buf[at + len(END) :], "header"
                continue
            keep = 0 if final else _partial_tail(self.buf, END)
            out.append(self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            break
        return "".join(reasoning), "".join(answer)

    def _header(self, final: bool, answer: list[str]) -> bool:
        """Read a message header from buf: True once one is read (state set to its channel's role; a tool
        call's header goes to `answer` as written), False to wait for more text. Anything else makes the
        rest of the reply raw answer text."""
        head = self.buf
        if head.startswith(START):
            head = head[len(START) :]
        for stray in STRAY:
            rest = head[len(stray) :]
            if head.startswith(stray) and rest.startswith(CHANNEL) and rest[len(CHANNEL) :].strip():
                head = rest
                break
        if not head and not final:
            return False
        if not head.startswith((CHANNEL, RECIPIENT)):
            if not final and (
                CHANNEL.startswith(head) or RECIPIENT.startswith(head) or START.startswith(self.buf)
            ):
                return False  # a marker may be coming
            self.state = "raw"
            return True
        at = head.find(MESSAGE)
        if at < 0:
            if final:
                self.state = "raw"
                return True
            return False
        if call_name(head[:at]) is not None:
            cut = at + len(MESSAGE)  # a stray channel before it is dropped, as for any message
            answer.append((START if self.buf.startswith(START) else "") + head[:cut])
            self.buf, self.state = head[cut:], "call"
            return True
        name = head[len(CHANNEL) : at]
        role = CHANNEL_ROLE.get(name) if head.startswith(CHANNEL) else None
        if role is None:  # a recipient (" to=functions.x") or an unknown channel: kept as written
            self.state = "raw"
            return True
        self.buf, self.state = head[at + len(MESSAGE) :], role
        return True
