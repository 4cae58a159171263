"""A scheduler driven without a model: `FakeRunner` stores token ids as its "KV cache" and samples a
deterministic function of the cached tokens, so a corrupt block table or a wrong prefix-cache hit shows up as
a wrong token (shared by the scheduler, spec-decoding and fairness tests); the engine tests' prompts; and
the chi-square helpers the sampling-distribution tests use."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from edgellm.engine.request import FINISH_STATUS, check_stop
from edgellm.engine.scheduler import Scheduler, SchedulerPlan
from edgellm.engine.sequence import Sequence

if TYPE_CHECKING:
    from edgellm import LLM


def next_token(tokens: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(tokens)) + 7 * len(tokens)) % 997


class FakeRunner:
    """The model runner, and the engine's part of a step: after the scheduler's postprocess, the engine's
    stop rule (check_stop: max_tokens, and `stop_ids`) finishes the sequences that stopped."""

    def __init__(self, sched: Scheduler, stop_ids: frozenset[int] = frozenset()) -> None:
        self.sched = sched
        self.stop_ids = stop_ids
        cfg = sched.config
        self.kv = [-1] * (cfg.num_blocks * cfg.block_size)  # -1: slot never written

    def step(self) -> tuple[SchedulerPlan, list[Sequence]]:
        plan = self.sched.schedule()
        bm, bs = self.sched.block_manager, self.sched.config.block_size
        for src, dst in plan.block_copies:
            self.kv[dst * bs : (dst + 1) * bs] = self.kv[src * bs : (src + 1) * bs]
        for seq, n in plan.scheduled:
            start = seq.num_computed_tokens
            for slot, tok in zip(
                bm.slot_mapping(seq, start, n), seq.tokens_to_compute(n), strict=True
            ):
                self.kv[slot] = tok
        sampled: dict[int, list[int]] = {}
        for seq, _ in plan.scheduled:
            if seq.seq_id in plan.sample_seq_ids:
                cached = [self.kv[s] for s in bm.slot_mapping(seq, 0, seq.num_tokens)]
                assert cached == seq.token_ids, f"KV of sequence {seq.seq_id} is corrupt"
                sampled[seq.seq_id] = [next_token(cached)]
        return plan, self.postprocess(plan, sampled)

    def postprocess(self, plan: SchedulerPlan, sampled: dict[int, list[int]]) -> list[Sequence]:
        """The scheduler's postprocess inside the engine's stop rule: each sequence's tokens cut at the
        first that stops it (check_stop), the sequences that stopped finished after."""
        stops = {}
        for seq, _ in plan.scheduled:
            limit = seq.max_tokens if seq.max_tokens is not None else sys.maxsize
            for i, tok in enumerate(sampled.get(seq.seq_id, [])):
                reason = check_stop(tok, seq.num_output_tokens + i + 1, limit, self.stop_ids)
                if reason is not None:
                    sampled[seq.seq_id] = sampled[seq.seq_id][: i + 1]
                    stops[seq.seq_id] = reason
                    break
        finished = self.sched.postprocess(plan, sampled)
        for seq_id, reason in stops.items():
            finished.append(self.sched.finish(seq_id, FINISH_STATUS[reason]))
        return finished

    def run(self, max_steps: int = 1000) -> list[Sequence]:
        done: list[Sequence] = []
        for _ in range(max_steps):
            if not self.sched.has_unfinished():
                return done
            done.extend(self.step()[1])
        raise AssertionError("scheduler did not drain")


def reference_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "My favourite fruit is",
    "1, 2, 3,",
    "Once upon a time",
    "The sky is blue because",
]


def wait_idle(llm: LLM) -> None:
    """Aborts reach the core asynchronously: wait (bounded) until its gauges say nothing runs."""

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = llm.stats()
        if s.num_running == 0 and s.num_waiting == 0 and s.kv_blocks_used == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine did not go idle: {llm.stats()}")


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: p = 1e-4, one-sided)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def chi2_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of two count vectors over the same categories."""
    keep = (a + b) > 0
    a, b = a[keep].astype(float), b[keep].astype(float)
    na, nb = a.sum(), b.sum()
    ea, eb = (a + b) * na / (na + nb), (a + b) * nb / (na + nb)
    return float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum()), int(keep.sum()) - 1
