"""Scoring inside the engine: the teacher-forced logits at every position of a token sequence (LLM.score,
the oracle tests). The input runs forward exactly like a prompt (chunked to the step's budget over the
paged KV cache, batched with generation in the same steps, preemptible) with logits kept at each of its
positions instead of sampled after the last; its KV blocks are freed the step its last chunk runs
(inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgellm.engine.protocol import EngineCoreOutput, FinishReason
from edgellm.engine.sequence import Sequence


@dataclass
class Scorer:
    """One scoring: its sequence and the logits rows of the chunks computed so far."""

    request_id: str
    seq: Sequence
    rows: list[np.ndarray] = field(default_factory=list)  # each chunk's [n, n_vocab], in position order
    expected: int = 0  # rows this step's chunk brings

    def plan(self, start: int, n: int) -> None:
        if start == 0:  # the first chunk, or a recompute after preemption: start over
            self.rows = []
        self.expected = n

    def add(self, hidden: np.ndarray, logits: np.ndarray) -> None:
        if len(logits) != self.expected:
            raise RuntimeError(f"{self.request_id}: expected {self.expected} logits rows, got {len(logits)}")
        self.rows.append(logits)

    def output(self) -> EngineCoreOutput:
        logits = np.concatenate(self.rows, axis=0)  # [num_tokens, n_vocab]
        if len(logits) != self.seq.num_tokens:
            n = self.seq.num_tokens
            raise RuntimeError(f"{self.request_id}: {len(logits)} logits rows for {n} tokens")
        return EngineCoreOutput(
            self.request_id,
            [],
            FinishReason.STOP,
            num_preemptions=self.seq.num_preemptions,
            request_finished=True,
            logits=logits,
        )
