"""Sampling on the device: the logits stay in device memory and only token ids (greedy) or a row's k best
(value, id) pairs (top-k sampling) cross the bus; the host sampler finishes from those.

The order is exactly numpy's, so the host sampler draws the same token as from the whole row: larger value
first, equal values by lower id; NaN ranks first for greedy (np.argmax returns the first NaN) and last for
top-k (np.argsort(-x, kind="stable") puts NaN at the end).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import MAX_TOP_K, ROW_THREADS


@cuda.jit(device=True, inline=True)
def _before(v, i, bv, bi, nan_first):  # noqa: ANN001, ANN201
    """True when entry (v, i) ranks ahead of (bv, bi)."""
    v_nan = v != v
    b_nan = bv != bv
    if v_nan or b_nan:
        if v_nan and b_nan:
            return i < bi
        return v_nan == nan_first
    return v > bv or (v == bv and i < bi)


@cuda.jit(cache=True)
def top_k_rows_cuda(x, x_off, x_ld, n, k, nan_first, out_v, out_i):  # noqa: ANN001
    """One block per row r: out_v[r, :k], out_i[r, :k] = the row's k best entries, best first (k <= n).

    Each thread keeps the k best of its strided share of the row in a sorted local list (insertion); then k
    rounds of a block-wide pick among the threads' list heads, the winner advancing its head. Ids within a
    thread's share rise, so an equal value never displaces an earlier entry: ties stay in id order."""
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    lv = cuda.local.array(MAX_TOP_K, np.float32)
    li = cuda.local.array(MAX_TOP_K, np.int32)
    cnt = 0
    for j in range(tid, n, ROW_THREADS):
        v = x[x_off + r * x_ld + j]
        if cnt == k and not _before(v, j, lv[k - 1], li[k - 1], nan_first):
            continue
        p = cnt if cnt < k else k - 1  # the slot freed at the end (the worst entry drops when full)
        while p > 0 and _before(v, j, lv[p - 1], li[p - 1], nan_first):
            lv[p] = lv[p - 1]
            li[p] = li[p - 1]
            p -= 1
        lv[p] = v
        li[p] = j
        if cnt < k:
            cnt += 1
    sv = cuda.shared.array(ROW_THREADS, np.float32)
    si = cuda.shared.array(ROW_THREADS, np.int32)  # -1: this thread's list is used up
    owner = cuda.shared.array(ROW_THREADS, np.int32)
    head = 0
    for slot in range(k):
        if head < cnt:
            sv[tid] = lv[head]
            si[tid] = li[head]
        else:
            sv[tid] = 0.0
            si[tid] = -1
        owner[tid] = tid
        cuda.syncthreads()
        s = ROW_THREADS // 2
        while s > 0:
            if tid < s:
                oi = si[tid + s]
                if oi >= 0 and (si[tid] < 0 or _before(sv[tid + s], oi, sv[tid], si[tid], nan_first)):
                    sv[tid] = sv[tid + s]
                    si[tid] = oi
                    owner[tid] = owner[tid + s]
            cuda.syncthreads()
            s //= 2
        if tid == 0:
            out_v[r, slot] = sv[0]
            out_i[r, slot] = si[0]
        if owner[0] == tid:
            head += 1
        cuda.syncthreads()  # everyone has read round `slot`'s winner before the next round overwrites it


@cuda.jit(device=True, inline=True)
def _block_best(sv, si, tid, nan_first):  # noqa: ANN001
    """Tree-reduce the block's (sv[t], si[t]) pairs (si < 0: empty) into sv[0], si[0]."""
    cuda.syncthreads()
    s = ROW_THREADS // 2
    while s > 0:
        if tid < s:
            oi = si[tid + s]
            if oi >= 0 and (si[tid] < 0 or _before(sv[tid + s], oi, sv[tid], si[tid], nan_first)):
                sv[tid] = sv[tid + s]
                si[tid] = oi
        cuda.syncthreads()
        s //= 2


@cuda.jit(cache=True)
def argmax_blocks_cuda(x, x_off, x_ld, n, chunk, part_v, part_i, done, out_i):  # noqa: ANN001
    """np.argmax of each row in one launch over many blocks: block (b, r) finds the best entry of chunk b of
    row r and writes it to part_*[r, b]; the row's last block to finish (an atomic count in done[r]) reduces
    the row's partial results and resets done[r] for the next launch. The order (value, then lower id, NaN
    first) is total, so the result does not depend on which block finishes last."""
    b = cuda.blockIdx.x
    r = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    nb = cuda.gridDim.x
    sv = cuda.shared.array(ROW_THREADS, np.float32)
    si = cuda.shared.array(ROW_THREADS, np.int32)
    last = cuda.shared.array(1, np.int32)
    bv = np.float32(0.0)
    bi = -1
    for j in range(b * chunk + tid, min(n, (b + 1) * chunk), ROW_THREADS):
        v = x[x_off + r * x_ld + j]
        if bi < 0 or _before(v, j, bv, bi, True):
            bv = v
            bi = j
    sv[tid] = bv
    si[tid] = bi
    _block_best(sv, si, tid, True)
    if tid == 0:
        part_v[r, b] = sv[0]
        part_i[r, b] = si[0]
        cuda.threadfence()  # the partial result is visible before the count says so
        last[0] = cuda.atomic.add(done, r, 1) == nb - 1
    cuda.syncthreads()
    if last[0]:
        bv = np.float32(0.0)
        bi = -1
        for k in range(tid, nb, ROW_THREADS):
            if part_i[r, k] >= 0 and (bi < 0 or _before(part_v[r, k], part_i[r, k], bv, bi, True)):
                bv = part_v[r, k]
                bi = part_i[r, k]
        sv[tid] = bv
        si[tid] = bi
        _block_best(sv, si, tid, True)
        if tid == 0:
            out_i[r] = si[0]
            done[r] = 0


@cuda.jit(cache=True)
def softcap_cuda(x, x_off, x_ld, n_rows, n, cap):  # noqa: ANN001
    """In place: x = tanh(x / cap) * cap (final logit soft-capping), before sampling or the copy to host."""
    for idx in range(cuda.grid(1), n_rows * n, cuda.gridsize(1)):  # grid-stride
        p = x_off + (idx // n) * x_ld + idx % n
        x[p] = np.float32(math.tanh(x[p] / cap)) * cap
