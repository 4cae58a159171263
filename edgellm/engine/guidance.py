"""Constrained decoding in the engine core: one llguidance matcher per constrained sequence, and the
allowed-token mask of each sampled one applied to its logits row before sampling.

The masks of a step are computed on a worker thread while that step's forward pass runs (llguidance
releases the GIL, and so do the kernels): `start(seq_ids)` right after scheduling, `mask(seq_id, row)`
when sampling (it waits for the masks only the first time). Sequences without a grammar never reach
llguidance: their rows are returned as they are, and a step without constrained sequences starts nothing.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from edgellm.grammar_compile import build_matcher

MASK_THREADS = 1  # llguidance's own pool: a mask is microseconds, a step's masks well under a millisecond


class GuidedDecoding:
    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        self.tokenizer, self.n_vocab = tokenizer, n_vocab
        self.matchers: dict[int, Any] = {}  # seq id -> llguidance.LLMatcher
        self._rows: dict[int, int] = {}  # seq id -> its row in _bitmask, for the step being computed
        self._bitmask = np.zeros((0, (n_vocab + 31) // 32), np.int32)  # [rows, n_vocab / 32] bit words
        self._pending: Future | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._executor: Any = None  # llguidance.LLExecutor

    # ---- sequences -----------------------------------------------------------------------------
    def add(self, seq_id: int, grammar: str) -> None:
        """A matcher for a new constrained sequence. `grammar` comes from edgellm.grammar.compile_grammar,
        and the front-end had a compile worker build this same matcher for this vocabulary first
        (check_for_vocabulary), so building it here cannot crash the core."""
        self.matchers[seq_id] = build_matcher(grammar, self.tokenizer, self.n_vocab)

    def fork(self, parent: int, child: int) -> None:
        """n > 1: the child continues from the parent's state (call before the parent consumes its token)."""
        matcher = self.matchers.get(parent)
        if matcher is not None:
            self.matchers[child] = matcher.deep_copy()

    def consume(self, seq_id: int, token: int) -> None:
        matcher = self.matchers.get(seq_id)
        if matcher is not None:
            # A token drawn from the mask is always accepted; were it not, the matcher is in its error
            # state and mask() then allows only end-of-generation tokens.
            matcher.consume_token(token)

    def free(self, seq_id: int) -> None:
        self.matchers.pop(seq_id, None)
        self._rows.pop(seq_id, None)

    # ---- one step ------------------------------------------------------------------------------
    def start(self, seq_ids: list[int]) -> None:
        """Start computing the next-token masks of the constrained sequences among `seq_ids`."""
        if not self.matchers:
            return
        rows = {}
        for sid in seq_ids:
            if sid in self.matchers:
                rows[sid] = len(rows)
        self._rows = rows
        if not rows:
            return
        if len(self._bitmask) < len(rows):
            grown = max(len(rows), 2 * len(self._bitmask))
            self._bitmask = np.zeros((grown, self._bitmask.shape[1]), np.int32)
        if self._worker is None:
            import llguidance as llg

            self._executor = llg.LLExecutor(num_threads=MASK_THREADS)
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgellm-grammar")
        from llguidance.numpy import fill_next_token_bitmask_par

        jobs = [(self.matchers[sid], i) for sid, i in rows.items()]
        self._pending = self._worker.submit(
            fill_next_token_bitmask_par, self._executor, jobs, self._bitmask[: len(rows)]
        )

    def mask(self, seq_id: int, row: np.ndarray) -> np.ndarray:
        """`row` ([n_vocab] logits) with every token the grammar forbids at -inf; `row` itself when the
        sequence has no grammar."""
        i = self._rows.get(seq_id)
        if i is None:
            return row
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        n = len(row)
        allowed = np.unpackbits(self._bitmask[i].view(np.uint8), count=n, bitorder="little").view(bool)
        if not allowed.any():  # a matcher in its error state: end the sequence
            allowed = np.zeros(n, bool)
            allowed[sorted(t for t in self.tokenizer.eog_ids if t < n)] = True
        return np.where(allowed, row, np.float32(-np.inf)).astype(np.float32, copy=False)
