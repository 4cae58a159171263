"""Embedding requests inside the engine: the input runs forward exactly like a prompt (chunked, batched
with generation in the same steps, preemptible) but nothing is sampled; the final hidden states (after
the output norm) of its tokens are pooled into one L2-normalized vector, and its KV blocks are freed the
step its last chunk runs (inputs.py keeps them beside the scorings).

An embedding sequence skips the prefix-cache lookup: mean pooling needs every token's hidden state, which
a cache hit would never compute. Its finished blocks are still offered to the cache (the K/V are the same
as a prompt's), and go back to the free pool as soon as it ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgellm.engine.checks import check_pooling  # noqa: F401 - re-exported: the engine checks with it
from edgellm.engine.protocol import EngineCoreOutput, FinishReason
from edgellm.engine.sequence import Sequence


def hidden_rows(pooling: str, start: int, n: int, total: int, causal: bool = True) -> np.ndarray:
    """Offsets, within a chunk of n tokens starting at position `start` of a `total`-token input, of the
    tokens whose hidden states the pooling needs: [n|1|0] int32. Rank reads the first token of an encoder
    (arch/encoder.py), the last of a causal model (llama.cpp's build_inp_cls)."""
    if pooling == "mean":
        return np.arange(n, dtype=np.int32)
    if pooling == "cls" or (pooling == "rank" and not causal):
        return np.zeros(1 if start == 0 else 0, np.int32)
    return np.full(1 if start + n == total else 0, n - 1, np.int32)  # last


@dataclass
class Pooler:
    """One embedding request: its sequence and the running pool of its hidden states."""

    request_id: str
    seq: Sequence
    pooling: str
    causal: bool = True  # the model's attention: where pooling "rank" reads (hidden_rows)
    acc: np.ndarray | None = None  # [n_embd] float64: the sum (mean), or the one pooled row (cls, last)
    n: int = 0  # rows in acc
    rows_wanted: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def plan(self, start: int, n: int) -> np.ndarray:
        """The rows of this step's chunk to pool (remembered for add())."""
        if start == 0:  # the first chunk, or a recompute after preemption: start over
            self.acc, self.n = None, 0
        self.rows_wanted = hidden_rows(self.pooling, start, n, self.seq.num_tokens, self.causal)
        return self.rows_wanted

    def add(self, rows: np.ndarray, logits: np.ndarray) -> None:
        """This chunk's hidden states [len(rows_wanted), n_embd] (it asked for no logits)."""
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
        """The pooled vector, L2-normalized: [n_embd] float32 (llama-server's default embd_normalize);
        with pooling "rank" the classification head's outputs as they are ([n_cls_out]: a reranker's
        score first)."""
        if self.acc is None or not self.n:
            raise RuntimeError(f"{self.request_id}: finished without hidden states to pool")
        v = self.acc / self.n
        if self.pooling == "rank":
            return v.astype(np.float32)
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
