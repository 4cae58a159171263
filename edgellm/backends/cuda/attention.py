"""Paged KV cache and attention on the device, in the engine's block layout.

K/V live as float16 [n_blocks, block_size, Hkv, d] per layer (llama.cpp's f16 cache; the CPU backend stores
the same f16-rounded values as f32). Attention reads keys through each sequence's block table, so decode
tokens and prefill chunks over cached prefixes (and sliding windows) are one kernel, one block per
(token, head): pass 1 the max score, pass 2 the softmax denominator (float64, as ggml), pass 3 the
softmax weights rounded to f16 (as llama.cpp multiplies V) times V, keys taken in order in chunks of
ROW_THREADS so each output element sums its terms in position order. Scores are recomputed per pass
rather than stored: no scratch that grows with the context, and d-long dots are cheap next to the matmuls.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import ACC_PER_THREAD, MAX_HEAD_DIM, ROW_THREADS, f16_round, mul_rn
from edgellm.backends.cuda.matmul import quantize_block


@cuda.jit(cache=True)
def write_kv_cuda(k, k_off, k_st, k_sh, v, v_off, v_st, v_sh, k_cache, v_cache, slots, n_kv, d, dv):  # noqa: ANN001
    """One thread per (token, kv head, element): store K/V at the token's slot, rounded to f16."""
    width = d + dv
    bs = k_cache.shape[1]
    for idx in range(cuda.grid(1), slots.shape[0] * n_kv * width, cuda.gridsize(1)):  # grid-stride
        i = idx % width
        h = (idx // width) % n_kv
        t = idx // (width * n_kv)
        blk = slots[t] // bs
        o = slots[t] % bs
        if i < d:
            k_cache[blk, o, h, i] = k[k_off + t * k_st + h * k_sh + i]
        else:
            v_cache[blk, o, h, i - d] = v[v_off + t * v_st + h * v_sh + i - d]


@cuda.jit(cache=True)
def copy_blocks_cuda(cache, src, dst, per_block):  # noqa: ANN001
    """Copy whole blocks src[p] -> dst[p] of one cache array viewed as [n_blocks, per_block]."""
    for idx in range(cuda.grid(1), src.shape[0] * per_block, cuda.gridsize(1)):  # grid-stride
        p = idx // per_block
        j = idx % per_block
        cache[dst[p], j] = cache[src[p], j]


@cuda.jit(device=True, inline=True)
def _score(qv, k_cache, blk, o, kvh, d, scale):  # noqa: ANN001, ANN201
    acc = np.float32(0.0)
    for i in range(d):
        acc += mul_rn(qv[i], np.float32(k_cache[blk, o, kvh, i]))
    return mul_rn(acc, scale)


@cuda.jit(device=True, inline=True)
def _block_reduce(red, v, is_max):  # noqa: ANN001, ANN201
    """Max or sum of v over the block (fixed tree); every thread gets the result."""
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    s = ROW_THREADS // 2
    while s > 0:
        if tid < s:
            if is_max:
                red[tid] = max(red[tid], red[tid + s])
            else:
                red[tid] += red[tid + s]
        cuda.syncthreads()
        s //= 2
    r = red[0]
    cuda.syncthreads()
    return r


@cuda.jit(cache=True)
def attention_paged_cuda(  # noqa: ANN001
    q,
    q_off,
    q_st,
    q_hs,
    k_cache,
    v_cache,
    block_tables,
    tok_seq,
    tok_pos,
    window,
    scale,
    n_heads,
    out,
    o_off,
    o_st,
    o_hs,
    quant,
    group,
    mode,
    xq,
    xs,
    xsum,
):
    """Causal paged attention; see the module docstring. One block per (token, head). With `quant`, each
    block also quantizes its head's output for the output projection (fused: needs dv a multiple of the
    activation block and heads contiguous in the row)."""
    t = cuda.blockIdx.x // n_heads
    h = cuda.blockIdx.x % n_heads
    tid = cuda.threadIdx.x
    d = k_cache.shape[3]
    dv = v_cache.shape[3]
    bs = k_cache.shape[1]
    kvh = h // (n_heads // k_cache.shape[2])
    s = tok_seq[t]
    p = tok_pos[t]
    start = 0
    if window > 0 and p - window + 1 > 0:
        start = p - window + 1
    n = p - start + 1
    qv = cuda.shared.array(MAX_HEAD_DIM, np.float32)
    red = cuda.shared.array(ROW_THREADS, np.float64)
    wts = cuda.shared.array(ROW_THREADS, np.float32)
    for i in range(tid, d, ROW_THREADS):
        qv[i] = f16_round(q[q_off + t * q_st + h * q_hs + i])
    cuda.syncthreads()
    mx = np.float32(-np.inf)
    for j in range(tid, n, ROW_THREADS):
        kp = start + j
        mx = max(mx, _score(qv, k_cache, block_tables[s, kp // bs], kp % bs, kvh, d, scale))
    mx = np.float32(_block_reduce(red, mx, True))
    total = 0.0
    for j in range(tid, n, ROW_THREADS):
        kp = start + j
        sc = _score(qv, k_cache, block_tables[s, kp // bs], kp % bs, kvh, d, scale)
        total += np.float32(math.exp(sc - mx))
    inv = np.float32(1.0 / _block_reduce(red, total, False))
    acc = cuda.local.array(ACC_PER_THREAD, np.float32)
    for a in range(ACC_PER_THREAD):
        acc[a] = 0.0
    for c0 in range(0, n, ROW_THREADS):
        j = c0 + tid
        if j < n:
            kp = start + j
            sc = _score(qv, k_cache, block_tables[s, kp // bs], kp % bs, kvh, d, scale)
            wts[tid] = f16_round(mul_rn(np.float32(math.exp(sc - mx)), inv))
        cuda.syncthreads()
        for jj in range(min(ROW_THREADS, n - c0)):
            kp = start + c0 + jj
            blk = block_tables[s, kp // bs]
            o = kp % bs
            w = wts[jj]
            for a in range(ACC_PER_THREAD):
                i = tid + a * ROW_THREADS
                if i < dv:
                    acc[a] += mul_rn(w, np.float32(v_cache[blk, o, kvh, i]))
        cuda.syncthreads()
    for a in range(ACC_PER_THREAD):
        i = tid + a * ROW_THREADS
        if i < dv:
            out[o_off + t * o_st + h * o_hs + i] = acc[a]
    if quant:
        cuda.syncthreads()  # the head's outputs were written by every thread
        block = 256 if mode == 2 else 32
        for b in range(tid, dv // block, ROW_THREADS):
            quantize_block(out, o_off + t * o_st, h * dv + b * block, block, group, mode, xq, xs, xsum, t)
