"""The engine's speculative decoding: before each schedule, every decoding sequence gets draft tokens from
the proposer (as many as its adaptive k and its max_tokens allow); after the verify forward, the sampler's
accepted counts feed the adaptive k and the acceptance counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgellm.engine.sequence import Sequence, SequenceStatus
from edgellm.engine.spec.adaptive import AdaptiveK
from edgellm.engine.spec.config import SpeculativeConfig


class Proposer(Protocol):
    cost: float  # proposing one draft token, in target decode steps (0 for a lookup)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """Up to k draft tokens to follow each (sequence, k)'s token_ids."""

    def drop(self, seq_id: int) -> None:
        """Forget a sequence that left the engine."""


@dataclass
class SpecCounters:
    draft_tokens: int = 0  # drafts sent to verification
    accepted_tokens: int = 0  # of those, accepted
    verify_steps: int = 0  # (sequence, step) pairs that verified at least one draft
    pauses: int = 0  # times adaptive k paused a sequence's speculation (acceptance under the break-even)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a sequence gains per verify step: accepted drafts plus the target's own token."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config, self.proposer = config, proposer
        self.adaptive = AdaptiveK(config.num_tokens, config.adaptive, proposer.cost)
        self.counters = SpecCounters()
        self._live: set[int] = set()
        self._batch = 1  # sequences decoding in the step proposed for (what a draft costs depends on it)

    def propose(self, running: list[Sequence]) -> None:
        """Set spec_token_ids of every running sequence whose next step is a decode."""
        requests = []
        live = set()
        decoding = []
        for seq in running:
            live.add(seq.seq_id)
            seq.spec_token_ids = []
            if seq.status == SequenceStatus.RUNNING and seq.num_uncomputed_tokens == 1:
                decoding.append(seq)
        self._batch = max(1, len(decoding))
        for seq in decoding:
            room = (seq.max_tokens - seq.num_output_tokens - 1) if seq.max_tokens is not None else 1 << 30
            k = min(self.adaptive.k_for(seq.seq_id, self._batch), room)
            if k > 0:
                requests.append((seq, k))
        for gone in self._live - live:
            self.forget(gone)
        self._live |= live
        if not requests:
            return
        for (seq, k), drafts in zip(requests, self.proposer.propose(requests), strict=True):
            seq.spec_token_ids = list(drafts[:k])

    def record(self, seq_id: int, num_drafts: int, num_accepted: int) -> None:
        if num_drafts <= 0:
            return
        c = self.counters
        c.draft_tokens += num_drafts
        c.accepted_tokens += num_accepted
        c.verify_steps += 1
        self.adaptive.update(seq_id, num_drafts, num_accepted, self._batch)
        c.pauses = self.adaptive.pauses

    def forget(self, seq_id: int) -> None:
        self._live.discard(seq_id)
        self.adaptive.drop(seq_id)
        self.proposer.drop(seq_id)
