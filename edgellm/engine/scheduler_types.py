"""What the scheduler is configured with (SchedulerConfig) and hands out: a step's plan (SchedulerPlan) and
its gauges (SchedulerStats). scheduler.py re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgellm.engine.block_manager import BlockCopy
from edgellm.engine.sequence import Sequence


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 16  # most sequences in the running set (and so in one batch)
    max_num_batched_tokens: int = 512  # token budget per step, summed over all scheduled sequences
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 256  # KV blocks in the pool
    long_prefill_chunk: int | None = None  # cap on tokens one sequence computes per step (None: budget)
    # Tokens embedding inputs may compute in one step. A prompt that arrives waits for the step in flight
    # to end: short steps of embedding work keep that wait short (and a prompt to prefill takes its step
    # alone: see _prefill_shares).
    max_pooled_tokens_per_step: int | None = 64
    enable_prefix_caching: bool = True
    # An encoder's inputs (arch/encoder.py): each runs whole in one step or waits, whatever its group's
    # share (its attention needs every key at once); max_num_batched_tokens must hold the longest input.
    whole_inputs: bool = False
    max_model_len: int | None = None  # longest sequence (prompt + max_tokens) accepted by add()

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Otherwise a full running set could not all decode in one step.
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.long_prefill_chunk is not None and self.long_prefill_chunk <= 0:
            raise ValueError("long_prefill_chunk must be positive")
        if self.max_pooled_tokens_per_step is not None and self.max_pooled_tokens_per_step <= 0:
            raise ValueError("max_pooled_tokens_per_step must be positive")


@dataclass
class SchedulerPlan:
    # (sequence, number of new tokens to compute this step), in batch order. A decode is 1 token, a prefill
    # chunk or a recompute many. seq.num_computed_tokens is NOT yet advanced: postprocess() does that.
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    # Sequences whose last scheduled token is their last token: they need logits and a sampled token.
    # A partial prefill chunk is not in here.
    sample_seq_ids: list[int] = field(default_factory=list)
    # Running sequences preempted this step: blocks freed, back in the waiting queue, will recompute.
    preempted: list[Sequence] = field(default_factory=list)
    # Copy-on-write (src_block, dst_block) pairs the runner must apply in list order before the forward pass.
    block_copies: list[BlockCopy] = field(default_factory=list)
    # Sum of the new-token counts in `scheduled` (<= max_num_batched_tokens).
    num_batched_tokens: int = 0
    # Sequences the scheduler itself finished this step (a lone sequence that outgrew the whole pool).
    finished: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks held by live sequences
    num_preemptions: int  # total since start
    prefix_cache_hit_rate: float  # hit tokens / looked-up tokens since start
