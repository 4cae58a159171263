"""Constrained decoding in the engine core: the llguidance matcher of each constrained completion (held
by the completion, engine/request.py), and the allowed-token mask of each sampled one applied to its
logits row before sampling.

The masks of a step are computed on a worker thread while that step's forward pass runs (llguidance
releases the GIL, and so do the kernels): `start(matchers)` right after scheduling, `mask(seq_id, row)`
when sampling (it waits for the masks only the first time). Sequences without a grammar never reach
llguidance: their rows are returned as they are, and a step without constrained sequences starts nothing.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from edgellm.grammar.native import build_matcher

MASK_THREADS = 1  # llguidance's own pool: a mask is microseconds, a step's masks well under a millisecond


class GuidedDecoding:
    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        self.tokenizer, self.n_vocab = tokenizer, n_vocab
        self._rows: dict[int, int] = {}  # seq id -> its row in _bitmask, for the step being computed
        self._bitmask = np.zeros((0, (n_vocab + 31) // 32), np.int32)  # [rows, n_vocab / 32] bit words
        self._pending: Future | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._executor: Any = None  # llguidance.LLExecutor

    def matcher(self, grammar: str) -> Any:
        """A matcher for a new constrained completion. `grammar` comes from
        edgellm.grammar.compile.compile_grammar, and the front-end had a compile worker build this same
        matcher for this vocabulary first (check_for_vocabulary), so building it here cannot crash the core. n
        > 1: the other completions take a deep_copy() of it before the first token is consumed."""
        return build_matcher(grammar, self.tokenizer, self.n_vocab)

    # ---- one step ------------------------------------------------------------------------------
    def start(self, matchers: dict[int, Any]) -> None:
        """Start computing the next-token masks of the constrained sequences sampled this step (seq id ->
        its completion's matcher)."""
        self._rows = rows = {sid: i for i, sid in enumerate(matchers)}
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

        jobs = [(matchers[sid], i) for sid, i in rows.items()]
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
