"""The front-end's per-request work, shared by LLM, the server and the TUI: the core's token ids become
text deltas (detokenization, stop strings; a matched stop string aborts that completion in the core) and
request metrics, handed on as RequestOutput objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgellm.engine.core_client import CoreClient
from edgellm.engine.outputs import CompletionDelta, RequestMetrics, RequestOutput, TextStream, now
from edgellm.sampling import SamplingParams
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
        if isinstance(item, BaseException):
            self.done = True
            self.deliver(item)
            return
        if self.done:
            return
        (rid, core_finished, wire_deltas, cached, preemptions, _), t = item
        m = self.metrics
        deltas = []
        for index, token_ids, reason, logprobs in wire_deltas:
            ts = self.texts[index]
            if ts.finish_reason is not None:
                continue  # sampled before the core saw this completion's abort
            if token_ids:
                if m.first_token_time is None:
                    m.first_token_time = t
                    m.num_cached_tokens = cached
                if index == 0:
                    m.token_times.append(t)
                m.num_generated_tokens += len(token_ids)
                text = "".join(ts.push(tok_id, reason) for tok_id in token_ids)
                if reason is None and ts.finish_reason is not None:  # a stop string matched
                    self.client.abort(rid, index)
            else:
                text = ts.finish(reason or "abort")
            deltas.append(CompletionDelta(index, list(token_ids), text, ts.finish_reason, logprobs))
        m.num_preemptions = preemptions
        finished = all(ts.finish_reason is not None for ts in self.texts)
        if finished:
            self.done = True
            m.finished_time = t
            if not core_finished:  # its last completion ended on a stop string: drop this sink
                self.client.abort(rid)
        if deltas or finished:
            self.deliver(RequestOutput(rid, deltas, finished, m))
