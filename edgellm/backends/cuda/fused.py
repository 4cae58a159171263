"""Fused kernels: fewer launches per layer at decode, where a launch from Python costs more than the work.

Each one does what a run of the plain kernels does, with the same device functions in the same thread
mapping, so its results are bitwise those of the unfused sequence (tests/cuda/test_cuda_engine.py):

- add_rmsnorm_quant_cuda: [y = rmsnorm(y) * wy (Gemma's post-norm)], [x += y (residual)],
  out = rmsnorm(x) * w, [out quantized for the next matmul]: one block per row.
- gated_act_quant_cuda: out = act(gate) * up, quantized for the down projection: one block per row.
- heads_rope_kv_cuda: [Q/K RMSNorm per head], RoPE on Q and K, K and V stored into the paged cache
  (f16, or quantized to q8_0).
- attention_paged_cuda (attention.py) quantizes its output for the output projection itself.

The backend issues them by deferring an op until it sees the one that consumes its output (deferred.py).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from edgellm.backends.cuda.act_quant import quantize_blocks
from edgellm.backends.cuda.config import ROW_THREADS
from edgellm.backends.cuda.kv_cache import KV_BLOCK, quantize_kv_block
from edgellm.backends.cuda.ops import gated, rms_scale, rope_pair, scale_row


@cuda.jit(device=True, inline=True)
def _quantize_row(out, base, n, group, mode, xq, xs, xsum, r):  # noqa: ANN001
    """Quantize row r (out[base : base + n], just written by this block) for the next matmul."""
    cuda.syncthreads()  # the row's elements were written by every thread of the block
    quantize_blocks(out, base, 0, n, group, mode, xq, xs, xsum, r)


@cuda.jit(cache=True)
def add_rmsnorm_quant_cuda(  # noqa: ANN001
    x,
    x_off,
    x_ld,
    y,
    y_off,
    y_ld,
    has_add,
    y_norm,
    wy,
    eps_y,
    w,
    eps,
    n,
    out,
    o_off,
    o_ld,
    quant,
    group,
    mode,
    xq,
    xs,
    xsum,
):
    r = cuda.blockIdx.x
    red = cuda.shared.array(ROW_THREADS, np.float64)
    xb = x_off + r * x_ld
    yb = y_off + r * y_ld
    if y_norm:  # rmsnorm(y, wy, eps, y) in place, as the model's post-norm
        scale_row(y, yb, rms_scale(y, yb, n, eps_y, red), wy, n, y, yb)
    if has_add:  # each thread adds the elements it reads next (and that it normalised in y)
        for i in range(cuda.threadIdx.x, n, ROW_THREADS):
            x[xb + i] += y[yb + i]
    scale_row(x, xb, rms_scale(x, xb, n, eps, red), w, n, out, o_off + r * o_ld)
    if quant:
        _quantize_row(out, o_off + r * o_ld, n, group, mode, xq, xs, xsum, r)


@cuda.jit(cache=True)
def gated_act_quant_cuda(g, g_off, g_ld, out, o_off, o_ld, ff, act, quant, group, mode, xq, xs, xsum):  # noqa: ANN001
    r = cuda.blockIdx.x
    gb = g_off + r * g_ld
    ob = o_off + r * o_ld
    for i in range(cuda.threadIdx.x, ff, ROW_THREADS):
        out[ob + i] = gated(g[gb + i], g[gb + ff + i], act)
    if quant:
        _quantize_row(out, ob, ff, group, mode, xq, xs, xsum, r)


@cuda.jit(cache=True)
def heads_rope_kv_cuda(  # noqa: ANN001
    q, q_off, q_st, q_sh, n_q, qw, k, k_off, k_st, k_sh, kw, has_norm, eps, v, v_off, v_st, v_sh,
    k_cache, v_cache, k_scale, v_scale, q8, slots, pos, n_kv, d, dv, inv_freq, mscale, neox,
):  # fmt: skip
    """One block per (token, head) of Q (heads 0..n_q-1; n_q = 0 when Q is not fused) then K: [the head's
    RMSNorm in place (Q/K norm)], its RoPE; a K head is then stored with its V head into the cache (f16
    values as they are computed, or with `q8` quantized to q8_0 once the whole head is rotated)."""
    n_h = n_q + n_kv
    t = cuda.blockIdx.x // n_h
    hh = cuda.blockIdx.x % n_h
    tid = cuda.threadIdx.x
    is_k = hh >= n_q
    h = hh - n_q if is_k else hh
    x = k if is_k else q
    p = k_off + t * k_st + h * k_sh if is_k else q_off + t * q_st + h * q_sh
    if has_norm:
        red = cuda.shared.array(ROW_THREADS, np.float64)
        scale_row(x, p, rms_scale(x, p, d, eps, red), kw if is_k else qw, d, x, p)
        cuda.syncthreads()  # a rotated pair spans elements other threads normalised
    blk = slots[t] // k_cache.shape[1]
    o = slots[t] % k_cache.shape[1]
    store = is_k and not q8
    n_rot = 2 * inv_freq.shape[0]
    for i in range(tid, n_rot // 2, ROW_THREADS):
        a, b = rope_pair(x, p, i, pos[t], inv_freq, mscale, n_rot, neox)
        if store:
            k_cache[blk, o, h, a] = x[p + a]
            k_cache[blk, o, h, b] = x[p + b]
    if store:
        for i in range(n_rot + tid, d, ROW_THREADS):
            k_cache[blk, o, h, i] = x[p + i]
        for i in range(tid, dv, ROW_THREADS):
            v_cache[blk, o, h, i] = v[v_off + t * v_st + h * v_sh + i]
    if is_k and q8:
        cuda.syncthreads()  # every thread's rotated pairs are in x: whole 32-value blocks can be read
        n_kb = d // KV_BLOCK
        for c in range(tid, n_kb + dv // KV_BLOCK, ROW_THREADS):
            if c < n_kb:
                quantize_kv_block(x, p + c * KV_BLOCK, k_cache, k_scale, blk, o, h, c)
            else:
                vb = v_off + t * v_st + h * v_sh + (c - n_kb) * KV_BLOCK
                quantize_kv_block(v, vb, v_cache, v_scale, blk, o, h, c - n_kb)
