"""Which KV cache blocks paged attention (attention.py) reads next, asked for before it reads them.

One head's K block is a few KiB apart from the next, and a batch's work items jump between sequences: the
hardware prefetcher, which follows a stream within a 4 KiB page, left a decode step's attention waiting on
memory (docs/benchmarks.md). The driver asks for each block PF_AHEAD blocks before its Q.K or P.V, and
for the next item's first K blocks during the last P.V blocks of the one before, for the tokens whose
sequence differs from the token before (a decode batch's; in a prefill chunk, its first token's).
Prefetches change no value and never fault; every block_tables entry read here is one the item itself
reads.
"""

from __future__ import annotations

from numba import njit

from edgellm.backends.cpu.ir_util import prefetch_l2

PF_AHEAD = 4  # blocks


@njit(cache=True, nogil=True, inline="always")
def prefetch_span(addr, n_bytes, stride, n_rows) -> None:
    """Prefetch n_rows spans of n_bytes each, stride bytes apart, starting at byte address addr."""
    for r in range(n_rows):
        for off in range(0, n_bytes, 64):
            prefetch_l2(addr + r * stride + off)


@njit(cache=True, nogil=True, inline="always")
def item_blocks(p, window, bs):
    """(first block b0, number of blocks nb, first attended column lo of block b0) of the positions a token
    at position p attends: max(0, p - window + 1) .. p (window <= 0: from 0)."""
    start = 0
    if window > 0 and p - window + 1 > 0:
        start = p - window + 1
    b0 = start // bs
    return b0, p // bs - b0 + 1, start - b0 * bs


@njit(cache=True, nogil=True, inline="always")
def seq_changes(tok_seq, t) -> bool:
    """Whether token t reads another sequence's blocks than token t - 1 (or is the first)."""
    return t == 0 or tok_seq[t - 1] != tok_seq[t]


@njit(cache=True, nogil=True, inline="always")
def prefetch_k(k_cache, blk, kvh) -> None:
    """Block blk's K of head kvh (f16: [d, block_size]; q8_0: [d / 32, 34, block_size]): one span."""
    addr = k_cache.ctypes.data + blk * k_cache.strides[0] + kvh * k_cache.strides[1]
    prefetch_span(addr, k_cache.strides[1], 0, 1)


@njit(cache=True, nogil=True, inline="always")
def prefetch_v(v_cache, blk, kvh) -> None:
    """Block blk's V rows of head kvh: block_size spans, a row apart."""
    addr = v_cache.ctypes.data + blk * v_cache.strides[0] + kvh * v_cache.strides[2]
    prefetch_span(addr, v_cache.strides[2], v_cache.strides[1], v_cache.shape[1])


@njit(cache=True, nogil=True, inline="always")
def prefetch_item_k(k_cache, block_tables, tok_seq, tok_pos, window, bs, n_kv, item, b_from, b_to) -> None:
    """Ask for work item `item`'s K blocks b_from .. b_to - 1 (counted from the first it attends; those
    past its last are not asked for: block_tables holds no more of them)."""
    t = item // n_kv
    b0, nb, _ = item_blocks(tok_pos[t], window, bs)
    for b in range(b_from, min(b_to, nb)):
        prefetch_k(k_cache, block_tables[tok_seq[t], b0 + b], item % n_kv)
