"""A generation request inside the engine core, all its state in one place: its params and stop rule, and
per completion its sequence id, sampler, grammar matcher and progress. A completion is its sequence's
`owner` (Sequence.owner): the engine gets from a scheduled sequence to its request without a side map.

`check_stop` is the core's one stop rule on token ids; stop strings are text, matched by the front-end
(outputs.TextStream), which then aborts the completion in the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgellm.engine.protocol import FinishReason
from edgellm.engine.sequence import SequenceStatus
from edgellm.sampling.sampler import Sampler, SamplingParams

# The status a completion's sequence finishes with, by why the completion ended.
FINISH_STATUS = {
    FinishReason.STOP: SequenceStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: SequenceStatus.FINISHED_LENGTH,
    FinishReason.ABORT: SequenceStatus.FINISHED_ABORTED,
}


@dataclass(eq=False)
class Completion:
    """One of a request's n completions (choices)."""

    request: Request
    index: int
    seq_id: int
    sampler: Sampler
    matcher: Any = None  # llguidance matcher while constrained (engine/guidance.py computes its masks)
    num_generated: int = 0  # tokens so far
    finished: bool = False

    def consume(self, token_id: int) -> None:
        if self.matcher is not None:
            # A token drawn from the mask is always accepted; were it not, the matcher is in its error
            # state and the mask then allows only end-of-generation tokens.
            self.matcher.consume_token(token_id)


@dataclass(eq=False)
class Request:
    request_id: str
    params: SamplingParams
    prompt_ids: list[int]
    stop_ids: frozenset[int]  # the request's stop ids, and end-of-generation ids unless ignore_eos
    max_tokens: int  # params.max_tokens, capped by the context window
    completions: list[Completion] = field(default_factory=list)  # [0] is the parent the others fork from
    forked: bool = False  # n > 1: the other completions exist (they fork after the first token)
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache served; set with the first token
    num_generated: int = 0  # over all completions
    num_preemptions: int = 0  # of completion 0's sequence, as it finished
    # What one sequence may hold past its prompt: max_tokens within the context (the scheduler checks the
    # pool can hold it); a rolling window's max_tokens runs past it, its sequence never does.
    seq_max_tokens: int = 0
    num_shifted: int = 0  # tokens a rolling window shifted out (all completions)
    has_media: bool = False  # images in the prompt (their KV is keyed by the images: not spilled to files)

    @classmethod
    def new(
        cls,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        eog_ids: frozenset[int],
        n_ctx: int,
        seq_ids: list[int],
    ) -> Request:
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eog_ids)
        shifts = params.context_shift_keep is not None  # a rolling window: only max_tokens ends it
        cap = params.max_tokens if shifts else min(params.max_tokens, n_ctx - len(prompt_ids))
        req = cls(request_id, params, prompt_ids, stop_ids, cap)
        req.seq_max_tokens = min(params.max_tokens, n_ctx - len(prompt_ids))
        req.completions = [
            Completion(req, i, sid, Sampler(params, rng_offset=i, stop_ids=stop_ids))
            for i, sid in enumerate(seq_ids)
        ]
        return req

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.completions)


def check_stop(
    token_id: int, num_generated: int, max_tokens: int, stop_ids: frozenset[int]
) -> FinishReason | None:
    """The stop rule on token ids: a stop or end-of-generation id ends a completion as STOP (it wins over
    the length), its `num_generated`-th token as LENGTH once that reaches max_tokens (a request's is
    already capped by the context window)."""
    if token_id in stop_ids:
        return FinishReason.STOP
    if num_generated >= max_tokens:
        return FinishReason.LENGTH
    return None


def cut_at_stop(c: Completion, token_ids: list[int]) -> tuple[list[int], FinishReason | None]:
    """A step's tokens for completion `c` (a verify step brings several) up to and including the first
    that ends it, and why it ends (None: it goes on)."""
    req = c.request
    for i, tok in enumerate(token_ids):
        reason = check_stop(tok, c.num_generated + i + 1, req.max_tokens, req.stop_ids)
        if reason is not None:
            return token_ids[: i + 1], reason
    return token_ids, None
