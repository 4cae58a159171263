"""Paged KV cache and attention on the device, in the engine's block layout.

K/V live as float16 [n_blocks, block_size, Hkv, d] per layer (llama.cpp's f16 cache), or as q8_0 blocks
(int8 values and float16 scales per 32, kv_cache.py), read directly: the `q8` flag picks the path.
Attention reads keys through each sequence's block table, so decode tokens and prefill chunks over
cached prefixes (and sliding windows) are one kernel, one block per (token, head) and split of its keys:
pass 1 the max score, pass 2 the softmax denominator (float64, as ggml), pass 3 the softmax weights
rounded to f16 (as llama.cpp multiplies V) times V, keys taken in order in chunks of ROW_THREADS so each
output element sums its terms in position order. Scores are recomputed per pass rather than stored: no
scratch that grows with the context, and d-long dots are cheap next to the matmuls.

Split-K: batch-1 decode has only n_heads blocks (4-9 on the small models), too few for a GPU at long
contexts, so a token with more than split_keys keys has them cut into splits (their number from the
token's context length alone, never from the batch: a token's bits do not depend on its neighbours), and
the last split to finish merges the others in a fixed order (attention_paged_cuda).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.act_quant import quantize_blocks
from edgellm.backends.cuda.config import (
    ACC_PER_THREAD,
    MAX_ATTN_SPLITS,
    MAX_HEAD_DIM,
    ROW_THREADS,
    f16_round,
    mul_rn,
)
from edgellm.backends.cuda.kv_cache import KV_BLOCK, quantize_kv_block


@cuda.jit(device=True, inline=True)
def _kv_item(idx, width, n_kv, slots, bs):  # noqa: ANN001, ANN201
    """Work item idx of a KV write over (token, kv head, width items): (t, h, item, block, offset)."""
    t = idx // (width * n_kv)
    return t, (idx // width) % n_kv, idx % width, slots[t] // bs, slots[t] % bs


@cuda.jit(cache=True)
def write_kv_cuda(  # noqa: ANN001
    k, k_off, k_st, k_sh, v, v_off, v_st, v_sh, k_cache, v_cache, k_scale, v_scale, q8, slots, n_kv, d, dv
):
    """f16: one thread per (token, kv head, element) stores it at the token's slot, rounded to f16. q8_0:
    one thread per (token, kv head, 32-value block) quantizes the block."""
    bs = k_cache.shape[1]
    n_kb = d // KV_BLOCK if q8 else d  # items of K per head: blocks or elements
    width = n_kb + (dv // KV_BLOCK if q8 else dv)
    for idx in range(cuda.grid(1), slots.shape[0] * n_kv * width, cuda.gridsize(1)):  # grid-stride
        t, h, i, blk, o = _kv_item(idx, width, n_kv, slots, bs)
        if q8 and i < n_kb:
            quantize_kv_block(k, k_off + t * k_st + h * k_sh + i * KV_BLOCK, k_cache, k_scale, blk, o, h, i)
        elif q8:
            c = i - n_kb
            quantize_kv_block(v, v_off + t * v_st + h * v_sh + c * KV_BLOCK, v_cache, v_scale, blk, o, h, c)
        elif i < d:
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
def _score(qv, k_cache, k_scale, q8, blk, o, kvh, d, scale):  # noqa: ANN001, ANN201
    acc = np.float32(0.0)
    if q8:  # per-block integer-valued sums times the block's scale
        for c in range(d // KV_BLOCK):
            part = np.float32(0.0)
            for i in range(c * KV_BLOCK, (c + 1) * KV_BLOCK):
                part += mul_rn(qv[i], np.float32(k_cache[blk, o, kvh, i]))
            acc += mul_rn(part, np.float32(k_scale[blk, o, kvh, c]))
    else:
        for i in range(d):
            acc += mul_rn(qv[i], np.float32(k_cache[blk, o, kvh, i]))
    return mul_rn(acc, scale)


@cuda.jit(device=True, inline=True)
def _capped(sc, softcap):  # noqa: ANN001, ANN201
    """cap * tanh(sc / cap) for softcap > 0 (llama.cpp's attn_soft_cap: a scale by 1/cap, tanh, a scale by
    cap), else sc."""
    if softcap > 0:
        return mul_rn(np.float32(math.tanh(mul_rn(sc, np.float32(1.0) / softcap))), softcap)
    return sc


@cuda.jit(device=True, inline=True)
def _key_score(qv, k_cache, k_scale, q8, block_tables, s, kp, kvh, d, scale, softcap):  # noqa: ANN001, ANN201
    """The (capped) score of sequence s's key at position kp."""
    bs = k_cache.shape[1]
    sc = _score(qv, k_cache, k_scale, q8, block_tables[s, kp // bs], kp % bs, kvh, d, scale)
    return _capped(sc, softcap)


@cuda.jit(device=True, inline=True)
def _v_value(v_cache, v_scale, q8, blk, o, kvh, i):  # noqa: ANN001, ANN201
    if q8:
        return mul_rn(np.float32(v_cache[blk, o, kvh, i]), np.float32(v_scale[blk, o, kvh, i // KV_BLOCK]))
    return np.float32(v_cache[blk, o, kvh, i])


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


def _split_plan(n, split_keys):  # noqa: ANN001, ANN202
    """(splits, keys per split) for a token with n keys: from n alone, never from the batch, so a token's
    result is the same whatever else is in the batch. split_keys <= 0: never split."""
    if split_keys <= 0 or n <= split_keys:
        return 1, n
    ns = min(MAX_ATTN_SPLITS, (n + split_keys - 1) // split_keys)
    chunk = (n + ns - 1) // ns
    return (n + chunk - 1) // chunk, chunk  # every split non-empty


split_plan = cuda.jit(device=True, inline=True)(_split_plan)


def max_splits(table_cols: int, block_size: int, window: int, split_keys: int) -> int:
    """The grid's split dimension: enough for the longest context a block table of this width can hold
    (a token with fewer splits leaves the extra blocks idle)."""
    keys = table_cols * block_size
    if window > 0:
        keys = min(keys, window)
    return _split_plan(max(keys, 1), split_keys)[0]


@cuda.jit(cache=True)
def attention_paged_cuda(  # noqa: ANN001
    q, q_off, q_st, q_hs, k_cache, v_cache, k_scale, v_scale, q8, block_tables, tok_seq, tok_pos, window,
    scale, softcap, sinks, has_sinks, n_heads, split_keys, part_ml, part_acc, done, out, o_off, o_st, o_hs,
    quant, group, mode, xq, xs, xsum,
):  # fmt: skip
    """Causal paged attention; see the module docstring. Block (token * n_heads + head, split). K/V: f16
    caches, or with `q8` q8_0 values and scales (k_scale / v_scale; placeholders otherwise). With `quant`,
    the block that writes a head's output also quantizes it for the output projection (fused: needs dv a
    multiple of the activation block and heads contiguous in the row). softcap > 0: llama.cpp's order for
    a soft-capped model (Gemma 2), as the CPU kernel: Q times `scale` before its f16 rounding, the Q.K
    unscaled, then capped (_capped) before the softmax. has_sinks: head h's softmax has one more logit,
    sinks[h] (float32 [H]; gpt-oss), in its max and its denominator and no value (ggml_soft_max_add_sinks,
    as the CPU kernel); placeholder otherwise.

    Split-K: a token with more than split_keys keys (split_plan) has its keys cut into consecutive splits,
    one block each; a split's softmax is normalised over its own keys (local max m_s, sum l_s, output
    acc_s) and stored in part_ml [2 * slot] / part_acc [slot * dv]; the token's last block to finish (an
    atomic count in done[row], reset for the next launch) merges the splits in split order:
    out = sum_s acc_s * l_s * exp(m_s - M) / L, M = max m_s, L = sum_s l_s * exp(m_s - M). With one split
    the block writes its output directly: the unsplit kernel's bits. A sink joins every split's max and the
    first split's sum, so the merged denominator counts it once."""
    row = cuda.blockIdx.x
    sp = cuda.blockIdx.y
    t = row // n_heads
    h = row % n_heads
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
    ns, chunk = split_plan(p - start + 1, split_keys)
    if sp >= ns:
        return  # the whole block: this token needs fewer splits than the grid has
    k0 = start + sp * chunk  # this split's first key position
    n = min(chunk, p - start + 1 - sp * chunk)
    qv = cuda.shared.array(MAX_HEAD_DIM, np.float32)
    red = cuda.shared.array(ROW_THREADS, np.float64)
    wts = cuda.shared.array(ROW_THREADS, np.float32)
    q_scale = scale if softcap > 0 else np.float32(1.0)  # Q before its f16 rounding
    kq_scale = np.float32(1.0) if softcap > 0 else scale  # the Q.K sums
    for i in range(tid, d, ROW_THREADS):
        qv[i] = f16_round(mul_rn(q[q_off + t * q_st + h * q_hs + i], q_scale))
    cuda.syncthreads()
    mx = np.float32(-np.inf)
    for j in range(tid, n, ROW_THREADS):
        kp = k0 + j
        mx = max(mx, _key_score(qv, k_cache, k_scale, q8, block_tables, s, kp, kvh, d, kq_scale, softcap))
    mx = np.float32(_block_reduce(red, mx, True))
    if has_sinks:
        mx = max(mx, sinks[h])
    total = 0.0
    for j in range(tid, n, ROW_THREADS):
        kp = k0 + j
        sc = _key_score(qv, k_cache, k_scale, q8, block_tables, s, kp, kvh, d, kq_scale, softcap)
        total += np.float32(math.exp(sc - mx))
    total = _block_reduce(red, total, False)
    if has_sinks and sp == 0:
        total += np.float32(math.exp(sinks[h] - mx))
    inv = np.float32(1.0 / total)
    acc = cuda.local.array(ACC_PER_THREAD, np.float32)
    for a in range(ACC_PER_THREAD):
        acc[a] = 0.0
    for c0 in range(0, n, ROW_THREADS):
        j = c0 + tid
        if j < n:
            kp = k0 + j
            sc = _key_score(qv, k_cache, k_scale, q8, block_tables, s, kp, kvh, d, kq_scale, softcap)
            wts[tid] = f16_round(mul_rn(np.float32(math.exp(sc - mx)), inv))
        cuda.syncthreads()
        for jj in range(min(ROW_THREADS, n - c0)):
            kp = k0 + c0 + jj
            blk = block_tables[s, kp // bs]
            o = kp % bs
            w = wts[jj]
            for a in range(ACC_PER_THREAD):
                i = tid + a * ROW_THREADS
                if i < dv:
                    acc[a] += mul_rn(w, _v_value(v_cache, v_scale, q8, blk, o, kvh, i))
        cuda.syncthreads()
    o_base = o_off + t * o_st + h * o_hs
    if ns == 1:
        for a in range(ACC_PER_THREAD):
            i = tid + a * ROW_THREADS
            if i < dv:
                out[o_base + i] = acc[a]
    elif not _merge_splits(acc, mx, total, row, sp, ns, dv, part_ml, part_acc, done, out, o_base):
        return  # another split of this token merges
    if quant:
        cuda.syncthreads()  # the head's outputs were written by every thread
        quantize_blocks(out, o_off + t * o_st, h * dv, dv, group, mode, xq, xs, xsum, t)


@cuda.jit(device=True, inline=True)
def _merge_splits(acc, mx, total, row, sp, ns, dv, part_ml, part_acc, done, out, o_base):  # noqa: ANN001, ANN201
    """Store this split's (m_s, l_s, acc_s); the token's last block merges all of them into out, in split
    order (deterministic whichever block finishes last). Returns True in the block that merged."""
    tid = cuda.threadIdx.x
    slot0 = row * cuda.gridDim.y
    for a in range(ACC_PER_THREAD):
        i = tid + a * ROW_THREADS
        if i < dv:
            part_acc[(slot0 + sp) * dv + i] = acc[a]
    if tid == 0:
        part_ml[2 * (slot0 + sp)] = mx
        part_ml[2 * (slot0 + sp) + 1] = total
    cuda.threadfence()  # every thread's partial results are visible before the count says so
    cuda.syncthreads()
    last = cuda.shared.array(1, np.int32)
    if tid == 0:
        last[0] = cuda.atomic.add(done, row, 1) == ns - 1
    cuda.syncthreads()
    if not last[0]:
        return False
    coef = cuda.shared.array(MAX_ATTN_SPLITS, np.float32)
    m_all = -np.inf
    for k in range(ns):
        m_all = max(m_all, part_ml[2 * (slot0 + k)])
    l_all = 0.0
    for k in range(ns):
        l_all += part_ml[2 * (slot0 + k) + 1] * math.exp(part_ml[2 * (slot0 + k)] - m_all)
    for k in range(tid, ns, ROW_THREADS):
        coef[k] = part_ml[2 * (slot0 + k) + 1] * math.exp(part_ml[2 * (slot0 + k)] - m_all) / l_all
    cuda.syncthreads()
    for a in range(ACC_PER_THREAD):
        i = tid + a * ROW_THREADS
        if i < dv:
            v = np.float32(0.0)
            for k in range(ns):
                v += mul_rn(coef[k], part_acc[(slot0 + k) * dv + i])
            out[o_base + i] = v
    if tid == 0:
        done[row] = 0
    return True
