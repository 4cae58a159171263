"""A request as the scheduler sees it: token ids plus how far the KV cache has caught up.

There is no prefill/decode phase (vLLM v1 model): a sequence simply has `num_computed_tokens` of its
`token_ids` in the KV cache and the scheduler decides how many of the rest to compute each step. A full
prefill, a prefill chunk, a prefix-cache hit, a decode step and a recompute after preemption are all the
same arithmetic on that one counter.

Speculative decoding adds nothing but `spec_token_ids`: draft tokens a proposer guessed to follow
`token_ids`. The scheduler budgets them as more tokens to compute after the one uncomputed token, the
runner scores them in the same forward, and postprocess keeps `num_computed_tokens` at the accepted ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any


class SequenceStatus(Enum):
    WAITING = auto()  # queued, never scheduled yet
    RUNNING = auto()  # owns KV blocks, scheduled every step it fits in the budget
    PREEMPTED = auto()  # queued again after losing its blocks; recomputes prompt + generated tokens
    FINISHED_STOPPED = auto()  # a stop token id, or an embedding computed (decided by the engine)
    FINISHED_LENGTH = auto()  # max_tokens reached, or the sequence outgrew the whole KV pool
    FINISHED_ABORTED = auto()  # cancelled by the caller

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset(
    {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH, SequenceStatus.FINISHED_ABORTED}
)


@dataclass(eq=False)  # identity semantics: two requests with equal tokens are still different requests
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int = -1  # -1: the whole of token_ids at construction is the prompt
    priority: int = 0  # lower value = more important; ties are broken by arrival (FCFS)
    max_tokens: int | None = None  # cap on generated tokens; also used to reject requests that can never fit
    arrival: int = -1  # admission order, assigned by Scheduler.add()
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # leading tokens whose K/V are already in the cache
    num_cached_tokens: int = 0  # of those, how many came from prefix-cache hits (last admission)
    block_table: list[int] = field(default_factory=list)  # KV block ids, logical block i -> physical id
    num_preemptions: int = 0
    pooled: bool = False  # an embedding: computed like a prompt, pooled instead of sampled (pooling.py)
    scored: bool = False  # a scoring: computed like a prompt, every position's logits kept (scoring.py)
    spec_token_ids: list[int] = field(default_factory=list)  # draft tokens to verify in the next step
    # The client request it came with (an HTTP request's embedding inputs, a request's n completions):
    # the scheduler shares a step's tokens out per group, not per sequence. None: a group of its own.
    group: Any = None
    # What the sequence is to the engine (engine/request.py's Completion: its request, sampler, grammar);
    # opaque to the scheduler. None for an embedding or scoring input (inputs.py keeps those by seq id).
    owner: Any = None
    # The LoRA adapters its tokens run with ((adapter id, scale), ...: edgellm/lora/choice.py), fixed at
    # admission; part of its prefix-cache keys (KV computed under other adapters is never reused)
    lora: tuple[tuple[int, float], ...] = ()
    # Images in the prompt (protocol.MediaSpan, by start): their embeddings replace those positions' token
    # rows, a non-causal one is computed in one step, and the prefix cache keys them by content hash.
    media: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)  # own the list: callers often reuse theirs
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)
        if not 0 < self.num_prompt_tokens <= len(self.token_ids):
            raise ValueError(f"sequence {self.seq_id}: needs at least one prompt token")
        if self.pooled and self.scored:
            raise ValueError(f"sequence {self.seq_id}: an embedding or a scoring, not both")

    @property
    def cache_ids(self) -> list:
        """token_ids as the prefix cache keys them: an image position is (its image's hash, its offset),
        so two prompts share KV only where their images are the same."""
        if not self.media:
            return self.token_ids
        ids: list = list(self.token_ids)
        for m in self.media:
            ids[m.start : m.end] = [(m.key, i) for i in range(m.end - m.start)]
        return ids

    def media_cut(self, start: int, n: int) -> int:
        """How many of the n tokens after `start` one step may compute: never ending inside a
        non-causal image (its tokens attend to each other, so they are computed together); 0 when the
        step cannot reach that image's end."""
        end = start + n
        for m in self.media:
            if m.non_causal and m.start < end < m.end:
                return m.start - start if m.start > start else 0
        return n

    @property
    def samples(self) -> bool:
        """A completion: its last token's logits are sampled. An embedding or a scoring computes its
        input only, every token of it (a prefix-cache hit would skip the rows it needs)."""
        return not (self.pooled or self.scored)

    @property
    def group_key(self) -> Any:
        return self.seq_id if self.group is None else ("group", self.group)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.token_ids) + len(self.spec_token_ids)

    def tokens_to_compute(self, n: int) -> list[int]:
        """The n tokens after the computed ones: token_ids first, then draft tokens."""
        c = self.num_computed_tokens
        tail = self.token_ids[c : c + n]
        return tail + self.spec_token_ids[: n - len(tail)] if len(tail) < n else tail

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
