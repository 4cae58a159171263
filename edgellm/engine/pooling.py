"""Embedding requests inside the engine: the input runs forward exactly like a prompt (chunked, batched
with generation in the same steps, preemptible) but nothing is sampled; the final hidden states (after
the output norm) of its tokens are pooled into one L2-normalized vector, and its KV blocks are freed the
step its last chunk runs.

An embedding sequence skips the prefix-cache lookup: mean pooling needs every token's hidden state, which
a cache hit would never compute. Its finished blocks are still offered to the cache (the K/V are the same
as a prompt's), and go back to the free pool as soon as it ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgellm.engine.protocol import EngineCoreOutput, FinishReason
from edgellm.engine.scheduler import Scheduler, SchedulerPlan
from edgellm.engine.sequence import Sequence, SequenceStatus

POOLABLE = ("mean", "cls", "last")


def check_pooling(pooling: str) -> None:
    if pooling not in POOLABLE:
        raise ValueError(
            f"this model's pooling type is {pooling!r} (its GGUF's pooling_type); embeddings support "
            f"{', '.join(POOLABLE)}"
        )


def hidden_rows(pooling: str, start: int, n: int, total: int) -> np.ndarray:
    """Offsets, within a chunk of n tokens starting at position `start` of a `total`-token input, of the
    tokens whose hidden states the pooling needs: [n|1|0] int32."""
    if pooling == "mean":
        return np.arange(n, dtype=np.int32)
    if pooling == "cls":
        return np.zeros(1 if start == 0 else 0, np.int32)
    return np.full(1 if start + n == total else 0, n - 1, np.int32)  # last


@dataclass
class Pooler:
    """One embedding request: its sequence and the running pool of its hidden states."""

    request_id: str
    seq: Sequence
    pooling: str
    acc: np.ndarray | None = None  # [n_embd] float64: the sum (mean), or the one pooled row (cls, last)
    n: int = 0  # rows in acc
    rows_wanted: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def plan(self, start: int, n: int) -> np.ndarray:
        """The rows of this step's chunk to pool (remembered for add())."""
        if start == 0:  # the first chunk, or a recompute after preemption: start over
            self.acc, self.n = None, 0
        self.rows_wanted = hidden_rows(self.pooling, start, n, self.seq.num_tokens)
        return self.rows_wanted

    def add(self, rows: np.ndarray) -> None:
        """This chunk's hidden states [len(rows_wanted), n_embd]."""
        if len(rows) != len(self.rows_wanted):
            raise RuntimeError(
                f"{self.request_id}: expected {len(self.rows_wanted)} hidden rows, got {len(rows)}"
            )
        if not len(rows):
            return
        total = rows.astype(np.float64).sum(axis=0)  # [n_embd]
        self.acc = total if self.acc is None else self.acc + total
        self.n += len(rows)

    def result(self) -> np.ndarray:
        """The pooled vector, L2-normalized: [n_embd] float32."""
        if self.acc is None or not self.n:
            raise RuntimeError(f"{self.request_id}: finished without hidden states to pool")
        v = self.acc / self.n
        norm = float(np.linalg.norm(v))
        return (v / norm if norm > 0 else v).astype(np.float32)

    def output(self) -> EngineCoreOutput:
        return EngineCoreOutput(
            self.request_id,
            [],
            FinishReason.STOP,
            num_preemptions=self.seq.num_preemptions,
            request_finished=True,
            embedding=self.result(),
        )


class PooledRequests:
    """The engine's embedding requests: admitted to its scheduler like prompts; the engine asks for their
    hidden rows when it builds a step's batch (rows_for), hands the forward pass's rows back (collect) and
    takes the finished vectors (finish)."""

    def __init__(self, scheduler: Scheduler, pooling: str) -> None:
        self.scheduler, self.pooling = scheduler, pooling
        self.by_request: dict[str, Pooler] = {}
        self.by_seq: dict[int, Pooler] = {}

    def __bool__(self) -> bool:
        return bool(self.by_request)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.by_request

    def add(
        self, request_id: str, ids: list[int], seq_id: int, priority: int, group: str | None = None
    ) -> None:
        check_pooling(self.pooling)
        seq = Sequence(seq_id, ids, priority=priority, max_tokens=0, pooled=True, group=group)
        self.scheduler.add(seq)  # raises before anything is registered if it can never fit
        p = Pooler(request_id, seq, self.pooling)
        self.by_request[request_id] = p
        self.by_seq[seq_id] = p

    def rows_for(self, seq: Sequence, start: int, n: int) -> np.ndarray | None:
        return self.by_seq[seq.seq_id].plan(start, n) if seq.pooled else None

    def collect(self, plan: SchedulerPlan, hidden: list[np.ndarray]) -> None:
        """A step's hidden rows, one entry per scheduled item (empty for generation items)."""
        for (seq, _), rows in zip(plan.scheduled, hidden, strict=True):
            if seq.pooled:
                self.by_seq[seq.seq_id].add(rows)

    def finish(self, plan: SchedulerPlan) -> list[EngineCoreOutput]:
        """After the scheduler's postprocess: the requests whose whole input is computed (blocks freed)."""
        outs = []
        for seq, _ in plan.scheduled:
            if (
                seq.pooled
                and seq.status == SequenceStatus.RUNNING
                and seq.num_computed_tokens == seq.num_tokens
            ):
                self.scheduler.finish(seq.seq_id, SequenceStatus.FINISHED_STOPPED)
                p = self.by_seq.pop(seq.seq_id)
                del self.by_request[p.request_id]
                outs.append(p.output())
        return outs

    def abort(self, request_id: str) -> bool:
        p = self.by_request.pop(request_id, None)
        if p is None:
            return False
        del self.by_seq[p.seq.seq_id]
        if self.scheduler.get(p.seq.seq_id) is not None:
            self.scheduler.abort(p.seq.seq_id)
        return True
