"""The reasoning split: what a thinking model writes inside `<think>...</think>` (Qwen3, DeepSeek-R1 and
their distills) comes apart from the answer, once, in the front-end's text pipeline (TextStream), so every
API surface reads the same two texts.

How a completion splits (`SamplingParams.reasoning_split`, chosen per request by `split_mode`):
- None: no split, the tags stay in the text.
- "open": the prompt opened the think block (Qwen3-2507 and DeepSeek-R1 templates end the generation
  prompt with `<think>`): the completion is reasoning up to `</think>`, the answer after it.
- "tag": the completion is reasoning only if it begins with `<think>` (leading whitespace allowed).
- "harmony": gpt-oss's channels (reasoning_harmony.py): "analysis" messages are reasoning, "final" ones
  the answer; chosen for a template that writes `<|channel|>`.

What callers read: `CompletionDelta.reasoning` (a step's new reasoning text; `CompletionDelta.text` is
then the answer's alone, the tags in neither), `CompletionOutput.reasoning` / `GenerationOutput.reasoning`
(the whole of it). `configure` sets a request's params to split.

`--reasoning-format` (`REASONING_FORMATS`) picks when a request splits: "none" never, "deepseek" always,
"auto" (the default) when the chat template thinks (it mentions `<think>`, or harmony's `<|channel|>`).

The reasoning budget (`SamplingParams.reasoning_budget`, tokens) is enforced in the engine core by
`forced_token`: once a completion has written that many tokens with the think block still open, the next
tokens are forced to `REASONING_END` (as llama.cpp's reasoning budget ends thinking), and the answer
follows. Budget 0 with a template that has an `enable_thinking` switch turns thinking off there instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgellm.chat.reasoning_harmony import ANALYSIS_OPEN, CHANNEL, END, HARMONY_REASONING_END, HarmonySplitter

if TYPE_CHECKING:
    from edgellm.sampling.sampler import SamplingParams

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_END = "\n</think>\n\n"  # what a budget forces: the close as Qwen3's template writes it
REASONING_FORMATS = ("none", "auto", "deepseek")
# split mode -> (what opens the reasoning, what closes it, what a budget forces to close it)
MARKERS = {
    "open": (THINK_OPEN, THINK_CLOSE, REASONING_END),
    "tag": (THINK_OPEN, THINK_CLOSE, REASONING_END),
    "harmony": (ANALYSIS_OPEN, END, HARMONY_REASONING_END),
}


def template_thinks(source: str) -> bool:
    """Whether a chat template is a thinking model's (it writes or expects `<think>` blocks, or harmony's
    channels)."""
    return THINK_OPEN in source or template_harmony(source)


def template_harmony(source: str) -> bool:
    """Whether a chat template writes OpenAI's harmony format (gpt-oss), as llama.cpp's chat.cpp tells."""
    return CHANNEL in source


def template_switch(source: str) -> str | None:
    """The template's variable that turns thinking on and off (Qwen3's `enable_thinking`), if it has one."""
    return "enable_thinking" if "enable_thinking" in source else None


def thinking_plan(
    fmt: str, server_budget: int, template_source: str, enable: bool | None
) -> tuple[dict[str, bool], int | None] | None:
    """(template variables, reasoning budget or None for unlimited) for a chat request that asked for
    thinking `enable` (None: the template's default) on a server with `--reasoning-format fmt` and
    `--reasoning-budget server_budget` (-1: unlimited, 0: no thinking). Thinking off goes to the
    template's switch where it has one, else to a budget of 0 (the think block closed at once). None when
    the request's on/off cannot be honoured: the template neither thinks nor has a switch (or the split
    is off and there is no switch to turn)."""
    switch = template_switch(template_source)
    splits = fmt == "deepseek" or (fmt == "auto" and template_thinks(template_source))
    if enable is not None and switch is None and not splits:
        return None
    off = enable is False or server_budget == 0
    # The switch is always set, as llama-server sets it (on unless asked off): llama.cpp's own templates
    # (models/templates) test `not enable_thinking`, so leaving it undefined would turn thinking off.
    kwargs = {switch: not off} if switch is not None else {}
    return kwargs, 0 if off else (None if server_budget < 0 else server_budget)


def split_mode(fmt: str, template_source: str, prompt_text: str) -> str | None:
    """How a completion of the chat prompt `prompt_text` splits under `--reasoning-format fmt`."""
    if fmt == "none" or (fmt == "auto" and not template_thinks(template_source)):
        return None
    if template_harmony(template_source):
        return "harmony"
    opened, closed = prompt_text.rfind(THINK_OPEN), prompt_text.rfind(THINK_CLOSE)
    return "open" if opened > closed else "tag"


def forced_token(p: SamplingParams, output: Sequence[int]) -> int | None:
    """The token the engine core must emit next to close a think block that ran past `p.reasoning_budget`
    tokens, or None to sample. `output` is the completion's tokens so far. In "tag" mode the block opens
    with the completion's first tokens (`reasoning_open_ids`), and the budget counts from after them; a
    block the model closed itself (`reasoning_close_ids` within the budget) is left be, and so is a
    completion that did not open one."""
    budget, end_ids = p.reasoning_budget, p.reasoning_end_ids
    if budget is None or not end_ids:
        return None
    start = len(p.reasoning_open_ids)
    at = len(output) - start - budget  # how far into the forced close the next token is
    if not 0 <= at < len(end_ids) or list(output[:start]) != list(p.reasoning_open_ids):
        return None
    if _contains(output[start : start + budget], p.reasoning_close_ids):
        return None
    return end_ids[at]


def _contains(ids: Sequence[int], sub: Sequence[int]) -> bool:
    k = len(sub)
    return k > 0 and any(list(ids[i : i + k]) == list(sub) for i in range(len(ids) - k + 1))


def make_splitter(mode: str) -> ReasoningSplitter | HarmonySplitter:
    """The splitter of a completion whose SamplingParams.reasoning_split is `mode`."""
    return HarmonySplitter() if mode == "harmony" else ReasoningSplitter(mode)


class ReasoningSplitter:
    """One completion's emitted text -> (reasoning delta, answer delta). Text that may be the start of a
    tag is held back until it is known not to be (or the completion ends)."""

    def __init__(self, mode: str) -> None:
        if mode not in ("open", "tag"):
            raise ValueError(f"reasoning split mode must be 'open' or 'tag', got {mode!r}")
        # start (is there a <think>?) -> start_reasoning -> reasoning -> start_answer -> answer
        self.state = "start_reasoning" if mode == "open" else "start"
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = answer = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(THINK_OPEN):
                self.buf, self.state = head[len(THINK_OPEN) :], "start_reasoning"
            elif THINK_OPEN.startswith(head) and not final:
                return "", ""  # `<thi` (or only whitespace): wait
            else:
                self.state = "answer"
        if self.state == "start_reasoning":  # the newline after <think> is the template's
            self.buf = self.buf.lstrip("\n")
            if not self.buf and not final:
                return "", ""
            self.state = "reasoning"
        if self.state == "reasoning":
            at = self.buf.find(THINK_CLOSE)
            if at >= 0:
                reasoning, self.buf = self.buf[:at].rstrip("\n"), self.buf[at + len(THINK_CLOSE) :]
                self.state = "start_answer"
            else:
                keep = 0  # a partial close tag, and the newlines before it, may turn out to be the close
                if not final:
                    keep = partial_tail(self.buf, THINK_CLOSE)
                    before = self.buf[: len(self.buf) - keep]
                    keep += len(before) - len(before.rstrip("\n"))
                reasoning, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                return reasoning, ""
        if self.state == "start_answer":  # the blank line after </think> is the template's, not the answer's
            stripped = self.buf.lstrip("\n")
            if not stripped and not final:
                return reasoning, ""
            self.buf, self.state = stripped, "answer"
        answer, self.buf = self.buf, ""
        return reasoning, answer


def partial_tail(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (held back: the marker may be coming)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def configure(params: SamplingParams, tokenizer: Any, mode: str | None, budget: int | None) -> None:
    """Set `params` to split as `mode` (split_mode's) with at most `budget` reasoning tokens (None:
    unlimited), the forced and watched ids from `tokenizer`."""
    params.reasoning_split = mode
    if mode is None or budget is None:
        return

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=True)

    opener, close, end = MARKERS[mode]
    params.reasoning_budget = budget
    params.reasoning_end_ids = ids(end)
    params.reasoning_close_ids = ids(close)
    # in "tag" and "harmony" modes the completion itself opens the reasoning
    params.reasoning_open_ids = ids(opener) if mode != "open" else []
