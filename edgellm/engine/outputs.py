"""What the front-end hands to its callers (LLM.generate, the server, the TUI): per-step RequestOutputs of
text deltas, and the text processing of one completion (TextStream: detokenization, stop strings, the
reasoning split). The core's messages are in protocol.py; its stop rule on token ids in request.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edgellm.chat.reasoning import make_splitter
from edgellm.engine.protocol import TokenLogprob
from edgellm.sampling.sampler import SamplingParams
from edgellm.tokenizer import StreamDecoder, Tokenizer


@dataclass
class CompletionDelta:
    """What one completion (choice) produced in one engine step."""

    index: int  # which of the request's n completions
    token_ids: list[int]  # new tokens this step
    text: str  # new text this step (never half a UTF-8 character, never part of a stop string)
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    logprobs: list[TokenLogprob] | None = None
    # New reasoning text this step, when the completion splits (SamplingParams.reasoning_split): what the
    # model wrote inside <think>...</think>, the tags left out; `text` is then the answer alone.
    reasoning: str = ""

    def add(self, d: CompletionDelta) -> None:
        """Append the next delta of the same completion: how the front-end adds deltas up, everywhere (the
        steps of one core message, LLM.generate, the server's whole responses, the TUI)."""
        self.token_ids.extend(d.token_ids)
        self.text += d.text
        self.reasoning += d.reasoning
        self.finish_reason = d.finish_reason or self.finish_reason
        if d.logprobs is not None:
            self.logprobs = (self.logprobs or []) + d.logprobs


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # wall time of every generated token
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_shifted_tokens: int = 0  # a rolling window's tokens shifted out of the context (all completions)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass
class RequestOutput:
    """One step's news for one request; `finished` when every completion has finished."""

    request_id: str
    deltas: list[CompletionDelta]
    finished: bool
    metrics: RequestMetrics


@dataclass
class CompletionOutput(CompletionDelta):
    """A whole completion, as LLM.generate returns it: its deltas added up."""

    @classmethod
    def empty(cls, index: int) -> CompletionOutput:
        return cls(index, [], "", None)


class OutputCollector:
    """One request's RequestOutputs added up: a CompletionOutput per completion, and the request's metrics
    once it finished."""

    def __init__(self, n: int) -> None:
        self.outputs = [CompletionOutput.empty(i) for i in range(n)]
        self.finished = False
        self.metrics: RequestMetrics | None = None

    def push(self, out: RequestOutput) -> None:
        for d in out.deltas:
            self.outputs[d.index].add(d)
        if out.finished:
            self.finished, self.metrics = True, out.metrics


class TextStream:
    """Front-end side of one completion: turns the core's token ids into text deltas (never half a UTF-8
    character, never part of a stop string) and finds stop strings. With `params.reasoning_split` the
    safe text then splits into reasoning and answer (edgellm.chat.reasoning): the deltas returned are the
    answer's, the reasoning's are taken with `take_reasoning`."""

    def __init__(self, tok: Tokenizer, params: SamplingParams) -> None:
        self.params = params
        self.decoder = StreamDecoder(tok)
        self.text = ""  # full text so far (after stop-string truncation), think block included
        self.emitted = 0  # chars of self.text already handed out
        self.hold = max((len(s) for s in params.stop), default=1) - 1  # chars that may start a stop string
        self.finish_reason: str | None = None
        split = params.reasoning_split
        self.splitter = make_splitter(split) if split is not None else None
        self.reasoning = ""  # reasoning text handed out so far
        self._reasoning_sent = 0  # chars of self.reasoning already taken

    def push_step(self, token_ids: list[int], core_reason: str | None) -> tuple[int, str]:
        """Account for the tokens the core sampled for this completion in one step (a verify step brings
        the accepted drafts and one more), with the core's verdict on the last of them ("stop": a stop id,
        whose text is not shown; "length"). Returns how many of the tokens the completion keeps (all, or
        up to the one that completed a stop string: the rest follow the end) and the text now safe to emit.
        Sets finish_reason, to "stop" also when a stop string matched (the caller then aborts the
        completion in the core)."""
        pieces = []
        last = len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            pieces.append(self._push(token_id, core_reason if i == last else None))
            if self.finish_reason is not None:
                return i + 1, "".join(pieces)
        return len(token_ids), "".join(pieces)

    def _push(self, token_id: int, core_reason: str | None) -> str:
        if core_reason == "stop":
            return self.finish("stop")
        search_from = max(0, len(self.text) - self.hold)
        self.text += self.decoder.push(token_id)
        for s in self.params.stop:
            at = self.text.find(s, search_from)
            if at >= 0:
                self.text = self.text[:at]  # what the decoder still holds lies past the stop string
                self.finish_reason = "stop"
                return self._take(final=True)
        if core_reason is not None:
            return self.finish(core_reason)
        return self._take(final=False)

    def finish(self, reason: str) -> str:
        """The completion ends (the core's verdict, or an abort): everything held back comes out, a
        trailing incomplete UTF-8 sequence as U+FFFD as a one-shot decode would give."""
        self.finish_reason = reason
        self.text += self.decoder.flush()
        return self._take(final=True)

    def _take(self, final: bool) -> str:
        end = len(self.text) if final else max(self.emitted, len(self.text) - self.hold)
        out = self.text[self.emitted : end]
        self.emitted = end
        if self.splitter is not None:
            reasoning, out = self.splitter.feed(out, final)
            self.reasoning += reasoning
        return out

    def take_reasoning(self) -> str:
        """The reasoning text handed out since the last call."""
        out = self.reasoning[self._reasoning_sent :]
        self._reasoning_sent = len(self.reasoning)
        return out


def now() -> float:
    return time.perf_counter()
