"""Activation quantization on the device, by quantize_act_ref's rule (llama.cpp's vec_dot types): mode 0
q8_0, 1 q8_1 (32 values per block), 2 q8_K (256 values). Output: xq int32 words of 4 int8 [M, K/4], xs (the
block's scale, per weight group) and xsum (scale * sum of the group's quants, for the weights' minimums)
f32 [M, K/G].

A team of QUANT_LANES threads (a warp on a GPU) quantizes one activation block: the lanes find the first
largest |x| with a shared-memory tree (the first index wins ties, as the serial rule: q8_K's scale takes
that element's sign), each lane then rounds whole 4-value words, and the group sums add the words' integer
sums. Integer sums and a max are exact in any order, so the bits are the serial rule's. quantize_blocks
serves quantize_act_cuda and the kernels that quantize their own output for the next matmul (fused.py,
attention.py), so both give the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import ROW_THREADS, SIMULATOR, f16_round, mul_rn, rint_f32

QUANT_LANES = 2 if SIMULATOR else 32
QUANT_TEAMS = ROW_THREADS // QUANT_LANES  # activation blocks a ROW_THREADS block quantizes at once
MAX_ACT_WORDS = 256 // 4  # words of the largest activation block (q8_K)


def act_block(mode: int) -> int:
    """Elements per activation quantization block: 256 for q8_K, 32 for q8_0 / q8_1."""
    return 256 if mode == 2 else 32


@cuda.jit(device=True)
def quantize_blocks(x, row, col0, n, group, mode, xq, xs, xsum, m):  # noqa: ANN001
    """Quantize x[row + col0 : row + col0 + n] (whole activation blocks of activation row m, from column
    col0) into xq / xs / xsum. All ROW_THREADS threads of the (1-D) block must call it: it has barriers."""
    tid = cuda.threadIdx.x
    team = tid // QUANT_LANES
    lane = tid % QUANT_LANES
    lead = team * QUANT_LANES
    block = 256 if mode == 2 else 32
    n_blocks = n // block
    ra = cuda.shared.array(ROW_THREADS, np.float32)  # each lane's largest |x| ...
    ri = cuda.shared.array(ROW_THREADS, np.int32)  # ... and its index in the block (-1: none > 0)
    ws = cuda.shared.array((QUANT_TEAMS, MAX_ACT_WORDS), np.int32)  # each word's sum of quants
    for b0 in range(0, n_blocks, QUANT_TEAMS):  # the same trip count in every team: barriers inside
        b = b0 + team
        active = b < n_blocks
        base = col0 + b * block  # the block's first column
        am = np.float32(0.0)
        ai = -1
        if active:
            for k in range(lane, block, QUANT_LANES):
                v = abs(x[row + base + k])
                if v > am:
                    am = v
                    ai = k
        ra[tid] = am
        ri[tid] = ai
        cuda.syncthreads()
        s = QUANT_LANES // 2
        while s > 0:
            if lane < s:
                oa = ra[tid + s]
                oi = ri[tid + s]
                if oa > ra[tid] or (oa == ra[tid] and oi >= 0 and oi < ri[tid]):
                    ra[tid] = oa
                    ri[tid] = oi
            cuda.syncthreads()
            s //= 2
        amax = ra[lead]
        d = iscale = d_stored = np.float32(0.0)
        if active:
            vmax = x[row + base + ri[lead]] if ri[lead] >= 0 else np.float32(0.0)
            if mode == 2:
                iscale = np.float32(-127.0) / vmax if amax > 0 else np.float32(0.0)
                d = np.float32(1.0) / iscale if amax > 0 else np.float32(0.0)
                d_stored = d
            else:
                iscale = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
                d = amax / np.float32(127.0)
                d_stored = f16_round(d)
            for wd in range(lane, block // 4, QUANT_LANES):
                word = 0
                wsum = 0
                for c in range(4):
                    qv = min(rint_f32(mul_rn(x[row + base + 4 * wd + c], iscale)), np.float32(127.0))
                    qi = np.int32(qv)
                    wsum += qi
                    if c == 3:
                        word = word | (qi << 24)
                    else:
                        word = word | ((qi & 255) << (8 * c))
                xq[m, base // 4 + wd] = word
                ws[team, wd] = wsum
        cuda.syncthreads()  # the block's word sums are in ws
        if active:
            gw = group // 4
            for g in range(lane, block // group, QUANT_LANES):
                gsum = 0
                for wd in range(g * gw, (g + 1) * gw):
                    gsum += ws[team, wd]
                gg = base // group + g
                xs[m, gg] = d_stored
                if mode == 1:
                    xsum[m, gg] = f16_round(d * np.float32(gsum))
                else:
                    xsum[m, gg] = d_stored * np.float32(gsum)
        cuda.syncthreads()  # ra / ri / ws are reused by the next round


@cuda.jit(cache=True)
def quantize_act_cuda(x, x_off, x_ld, k_cols, group, mode, xq, xs, xsum):  # noqa: ANN001
    """Block (row m, c) of ROW_THREADS threads quantizes activation blocks c * QUANT_TEAMS ... of row m."""
    m = cuda.blockIdx.x
    block = 256 if mode == 2 else 32
    col0 = cuda.blockIdx.y * QUANT_TEAMS * block
    n = min(QUANT_TEAMS * block, k_cols - col0)
    quantize_blocks(x, x_off + m * x_ld, col0, n, group, mode, xq, xs, xsum, m)
