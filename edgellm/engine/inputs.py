"""The engine's requests that compute an input and take one result from it, nothing sampled: embeddings
(pooling.py's Pooler) and scorings (scoring.py's Scorer). Each is one sequence that the scheduler admits,
chunks, batches and preempts like a prompt (Sequence.samples is False: no prefix-cache hit, no sampled
token); the engine asks for a scheduled one's hidden rows when it builds a step's batch (hidden_rows),
hands the forward pass's hidden rows and logits back (collect) and takes the finished results (finish),
the KV blocks freed that step."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgellm.engine.protocol import EngineCoreOutput
from edgellm.engine.scheduler import Scheduler, SchedulerPlan
from edgellm.engine.sequence import Sequence, SequenceStatus


class InputWork(Protocol):
    request_id: str
    seq: Sequence

    def plan(self, start: int, n: int) -> np.ndarray | None:
        """This step computes tokens start..start+n: the offsets of the hidden rows it needs (None: none)."""

    def add(self, hidden: np.ndarray, logits: np.ndarray) -> None:
        """The step's rows for this input: the hidden rows plan() asked for, and its logits rows."""

    def output(self) -> EngineCoreOutput:
        """The finished request's output (request_finished)."""


class InputRequests:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.by_request: dict[str, InputWork] = {}
        self.by_seq: dict[int, InputWork] = {}

    def __bool__(self) -> bool:
        return bool(self.by_request)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.by_request

    def add(self, work: InputWork) -> None:
        self.scheduler.add(work.seq)  # raises before anything is registered if it can never fit
        self.by_request[work.request_id] = work
        self.by_seq[work.seq.seq_id] = work

    def hidden_rows(self, seq: Sequence, start: int, n: int) -> np.ndarray | None:
        return None if seq.samples else self.by_seq[seq.seq_id].plan(start, n)

    def collect(self, plan: SchedulerPlan, hidden: list[np.ndarray], logits: list[np.ndarray | None]) -> None:
        """A step's hidden rows and logits rows, one entry each per scheduled item."""
        for (seq, _), h, lg in zip(plan.scheduled, hidden, logits, strict=True):
            if not seq.samples:
                self.by_seq[seq.seq_id].add(h, lg)

    def finish(self, plan: SchedulerPlan) -> list[EngineCoreOutput]:
        """After the scheduler's postprocess: the requests whose whole input is computed (blocks freed)."""
        outs = []
        for seq, _ in plan.scheduled:
            if (
                not seq.samples
                and seq.status == SequenceStatus.RUNNING
                and seq.num_computed_tokens == seq.num_tokens
            ):
                self.scheduler.finish(seq.seq_id, SequenceStatus.FINISHED_STOPPED)
                work = self.by_seq.pop(seq.seq_id)
                del self.by_request[work.request_id]
                outs.append(work.output())
        return outs

    def abort(self, request_id: str) -> bool:
        work = self.by_request.pop(request_id, None)
        if work is None:
            return False
        del self.by_seq[work.seq.seq_id]
        if self.scheduler.get(work.seq.seq_id) is not None:
            self.scheduler.abort(work.seq.seq_id)
        return True
