"""The front-end's per-request work, shared by LLM, the server and the TUI: the core's token ids become
text deltas (detokenization, stop strings; a matched stop string aborts that completion in the core; the
reasoning split into `CompletionDelta.reasoning`) and request metrics, handed on as RequestOutput
objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgellm.engine.core_client import CoreClient
from edgellm.engine.outputs import CompletionDelta, RequestMetrics, RequestOutput, TextStream, now
from edgellm.engine.protocol import EngineCoreOutput
from edgellm.sampling.sampler import SamplingParams
from edgellm.tokenizer import Tokenizer

# Receives a RequestOutput per step, or one exception; called on the core client's receiver thread.
Deliver = Callable[[Any], None]


class RequestStream:
    """One request's front-end state: a TextStream per completion, and its metrics."""

    def __init__(
        self,
        client: CoreClient,
        tok: Tokenizer,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        deliver: Deliver,
    ) -> None:
        self.client, self.rid, self.params, self.deliver = client, rid, params, deliver
        self.texts = [TextStream(tok, params) for _ in range(params.n)]
        self.metrics = RequestMetrics(arrival_time=now(), num_prompt_tokens=len(prompt_ids))
        self.done = False

    def __call__(self, item: Any) -> None:
        """`item`: the core's outputs for this request from one message, [(EngineCoreOutput, step time),
        ...] in step order (several steps when the core batches by stream_interval), or an exception.
        Hands on one RequestOutput: a completion's tokens and text from all those steps in one delta."""
        if isinstance(item, BaseException):
            self.done = True
            self.deliver(item)
            return
        if self.done:
            return
        deltas: dict[int, CompletionDelta] = {}
        for out, t in item:
            delta = self._text(out, t)
            if delta is not None:
                d = deltas.get(out.index)
                if d is None:
                    deltas[out.index] = delta
                else:
                    d.add(delta)
        m = self.metrics
        finished = all(ts.finish_reason is not None for ts in self.texts)
        if finished:
            self.done = True
            m.finished_time = item[-1][1]
            if not item[-1][0].request_finished:  # its last completion ended on a stop string: drop this sink
                self.client.abort(self.rid)
        if deltas or finished:
            self.deliver(RequestOutput(self.rid, list(deltas.values()), finished, m))

    def _text(self, out: EngineCoreOutput, t: float) -> CompletionDelta | None:
        """One completion's output of one step as text, and the metrics it brings; None when the
        completion had already ended here (sampled before the core saw its abort)."""
        m = self.metrics
        m.num_preemptions = out.num_preemptions
        m.num_shifted_tokens = out.num_shifted_tokens
        ts = self.texts[out.index]
        if ts.finish_reason is not None:
            return None
        token_ids, logprobs = out.new_token_ids, out.logprobs
        reason = None if out.finish_reason is None else str(out.finish_reason)
        if token_ids:
            kept, text = ts.push_step(token_ids, reason)
            token_ids = token_ids[:kept]  # a stop string ended it inside a verify step's tokens
            if logprobs is not None:
                logprobs = logprobs[:kept]
            if reason is None and ts.finish_reason is not None:  # a stop string matched
                self.client.abort(self.rid, out.index)
            if m.first_token_time is None:
                m.first_token_time = t
                m.num_cached_tokens = out.num_cached_tokens
            if out.index == 0:
                m.token_times.extend([t] * len(token_ids))
            m.num_generated_tokens += len(token_ids)
        else:
            text = ts.finish(reason or "abort")
        reasoning = ts.take_reasoning()
        return CompletionDelta(out.index, list(token_ids), text, ts.finish_reason, logprobs, reasoning)
