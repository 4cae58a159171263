"""Paged attention on the CPU: Q.K and P.V inner loops written as LLVM vector IR (attention_ir.py, where
the cache layouts are described), the rest in Numba.

The cache holds f16 values (uint16 bit patterns, as llama.cpp's default cache) or q8_0 blocks (as its
`--cache-type-k/-v q8_0`); the kernels widen them in registers. Attention over a long batch is bound by
reading the cache, so it is never copied or dequantized first. One driver serves both types: the few steps
that differ (geometry, the Q.K and P.V of a block) are Numba overloads picked by the cache's element type
at compile time (_KV_IMPLS), so there is no branch on the type at run time.

Each (token, KV head) is one work item; its query heads (the GQA group) share every K/V load. Positions run
in order and each output's sums are fixed by its own token, so results do not depend on the batch.
Roundings follow llama.cpp's CPU attention: Q in f16 for Q.K, f32 exps with a float64 sum, f16 weights
for P.V (the cache holds f16-rounded or q8_0-quantized values).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from edgellm.backends.cpu import attention_ir
from edgellm.backends.cpu.attention_ir import (
    LANES,
    MAX_GROUP,
    Q8_BLOCK,
    pv_f16_call,
    pv_q8_0_call,
    qk_f16_call,
    qk_q8_0_call,
)
from edgellm.backends.cpu.attention_prefetch import (
    PF_AHEAD,
    item_blocks,
    prefetch_item_k,
    prefetch_k,
    prefetch_v,
    seq_changes,
)
from edgellm.backends.cpu.expf import EXP2_TABLE, exp_nonpositive_inplace, vector_expf_variant
from edgellm.backends.cpu.fp16 import HALF_OPS_NATIVE, f16_bits_to_f32, f16_round_inplace
from edgellm.backends.cpu.numba_cache import follow_sources

SAFE_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}  # no nnan/ninf: softmax uses -inf
_pv_vectors = njit(cache=True, inline="always")(attention_ir.pv_vectors)  # P.V accumulators per head
# which expf build this process's C library has (a constant of the compiled code: Numba's cache is per
# host CPU, and so is glibc's choice)
_EXPF_VARIANT = vector_expf_variant()


@njit(cache=True, nogil=True)
def _f16_round_unit_inplace(a: np.ndarray) -> None:
    """Round values in [0, 1] to float16 values (ties to even) without branches, so the loops vectorise:
    below 2^-14 (f16 subnormals, a fixed step of 2^-24) rint on the value scaled by 2^24 (exact power-of-2
    scalings: no fast-math rewrite can change it, unlike an (x + 0.5) - 0.5 trick, which LLVM folded away
    once inlined into a fast-math caller); above, the integer rounding of f16_round_inplace."""
    for i in range(a.shape[0]):
        x = a[i]
        a[i] = np.rint(x * np.float32(16777216.0)) * np.float32(2.0**-24) if x < np.float32(2.0**-14) else x
    bits = a.view(np.uint32)
    for i in range(a.shape[0]):
        b = bits[i]
        r = (b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        bits[i] = r if b >= np.uint32(0x38800000) else b


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _softmax_f16_row(s: np.ndarray, softcap: float, sink: np.float32) -> None:
    """In place: s = f16(softmax(s)) as ggml's soft_max (f32 exps, float64 sum, f32 scale by 1/sum),
    then the f16 rounding llama.cpp applies before multiplying V. softcap > 0: the scores are first
    capped to cap * tanh(s / cap), as llama.cpp's attn_soft_cap (a scale by 1/cap, tanh, a scale by cap).
    sink: one more logit in the max and the sum, with no entry of its own (ggml_soft_max_add_sinks); -inf
    for none (it then adds an exact 0)."""
    if softcap > 0:
        inv_cap, cap = np.float32(1.0) / np.float32(softcap), np.float32(softcap)
        for j in range(s.shape[0]):
            s[j] = np.tanh(s[j] * inv_cap) * cap
    m = sink
    for j in range(s.shape[0]):
        m = max(m, s[j])
    for j in range(s.shape[0]):
        s[j] = s[j] - m
    # the C library's expf, as llama.cpp's CPU attention (a polynomial of ggml's own, ggml_v_expf, flipped
    # one of 122 teacher-forced Gemma 3 tokens against it), bit for bit but vectorised (expf.py)
    exp_nonpositive_inplace(s, _EXPF_VARIANT, EXP2_TABLE)
    total = 0.0  # float64 sum of the float32 exps
    for j in range(s.shape[0]):
        total += s[j]
    total += np.exp(sink - m)
    inv = np.float32(1.0 / total)
    for j in range(s.shape[0]):
        s[j] *= inv
    _f16_round_unit_inplace(s)


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _qk_loop_f16(qh, k_cache, blk, kvh, scale, scores, col) -> None:
    """Q.K for one block without the IR kernel (any block size / group): same layout, plain loops."""
    group, d = qh.shape
    bs = k_cache.shape[3]
    for g in range(group):
        for pos in range(bs):
            acc = np.float32(0.0)
            for i in range(d):
                acc += qh[g, i] * f16_bits_to_f32(k_cache[blk, kvh, i, pos])
            scores[g, col + pos] = acc * scale


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _pv_loop_f16(scores, col, n, v_cache, blk, row0, kvh, acc) -> None:
    """P.V over rows row0..row0+n-1 of one block without the IR kernel."""
    group, dv = acc.shape
    for j in range(n):
        for g in range(group):
            w = scores[g, col + j]
            for i in range(dv):
                acc[g, i] += w * f16_bits_to_f32(v_cache[blk, row0 + j, kvh, i])


@njit(cache=True, nogil=True, inline="always")
def _i8(x: np.uint8) -> np.float32:
    """A q8_0 value stored as a byte, as float32."""
    v = np.int32(x)
    return np.float32(v - 256 if v > 127 else v)


@njit(cache=True, nogil=True, inline="always")
def _k_scale_q8_0(k_cache, blk, kvh, c, pos) -> np.float32:
    """The f16 scale of position pos's 32-dim block c (rows 0-1 of the block hold block_size scales)."""
    bs = k_cache.shape[4]
    b = 2 * pos
    lo = np.uint16(k_cache[blk, kvh, c, b // bs, b % bs])
    hi = np.uint16(k_cache[blk, kvh, c, (b + 1) // bs, (b + 1) % bs])
    return f16_bits_to_f32(lo | (hi << np.uint16(8)))


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _qk_loop_q8_0(qh, k_cache, blk, kvh, scores, col) -> None:
    """Q.K over a q8_0 block without the IR kernel (qh already times the attention scale)."""
    group, d = qh.shape
    bs = k_cache.shape[4]
    for g in range(group):
        for pos in range(bs):
            acc = np.float32(0.0)
            for c in range(d // Q8_BLOCK):
                part = np.float32(0.0)
                for i in range(Q8_BLOCK):
                    part += qh[g, c * Q8_BLOCK + i] * _i8(k_cache[blk, kvh, c, 2 + i, pos])
                acc += part * _k_scale_q8_0(k_cache, blk, kvh, c, pos)
            scores[g, col + pos] = acc


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _pv_loop_q8_0(scores, col, n, v_cache, blk, row0, kvh, acc) -> None:
    group, dv = acc.shape
    for j in range(n):
        for c in range(dv // Q8_BLOCK):
            row = v_cache[blk, row0 + j, kvh, c]
            d = f16_bits_to_f32(np.uint16(row[0]) | (np.uint16(row[1]) << np.uint16(8)))
            for g in range(group):
                w = scores[g, col + j]
                for i in range(Q8_BLOCK):
                    acc[g, c * Q8_BLOCK + i] += w * (_i8(row[2 + i]) * d)


# ---- what differs per cache type: Numba overloads picked by the cache's element type ------------------
def _kv_geometry(k_cache, v_cache):  # noqa: ANN001, ANN202
    """(n_kv, block_size, dv) of a layer's cache."""
    raise NotImplementedError("only called from Numba code")


def _prepare_q(k_cache, qh, scale):  # noqa: ANN001, ANN202
    """In place on the f16-rounded Q rows [group, d] before the Q.K of every block."""
    raise NotImplementedError("only called from Numba code")


def _qk_block(fast, group, qh, k_cache, blk, kvh, scale, scale_bits, scores, col, width):  # noqa: ANN001, ANN202
    """scores[g, col : col + block_size] = scale * Q.K of every position of cache block blk."""
    raise NotImplementedError("only called from Numba code")


def _pv_rows(fast, group, scores, col, width, n, v_cache, blk, r0, kvh, acc):  # noqa: ANN001, ANN202
    """acc[g] += sum_j scores[g, col + j] * V[blk, r0 + j] over n rows of cache block blk."""
    raise NotImplementedError("only called from Numba code")


def _f16_geometry(k_cache, v_cache):  # noqa: ANN001, ANN202
    return k_cache.shape[1], k_cache.shape[3], v_cache.shape[3]


def _q8_0_geometry(k_cache, v_cache):  # noqa: ANN001, ANN202
    return k_cache.shape[1], k_cache.shape[4], v_cache.shape[3] * Q8_BLOCK


def _f16_prepare_q(k_cache, qh, scale):  # noqa: ANN001, ANN202
    pass  # the f16 kernels scale the sums, as llama.cpp's kq_scale


def _q8_0_prepare_q(k_cache, qh, scale):  # noqa: ANN001, ANN202
    s = np.float32(scale)
    for g in range(qh.shape[0]):
        for i in range(qh.shape[1]):
            qh[g, i] *= s  # the q8_0 kernels sum per-block products: the scale folds into Q once


def _f16_qk_block(fast, group, qh, k_cache, blk, kvh, scale, scale_bits, scores, col, width):  # noqa: ANN001, ANN202
    if fast:
        kb0, kb1, kb2 = k_cache.strides[0], k_cache.strides[1], k_cache.strides[2]
        for sb in range(k_cache.shape[3] // LANES):
            qk_f16_call(
                group, qh.ctypes.data, qh.shape[1],
                k_cache.ctypes.data + blk * kb0 + kvh * kb1 + sb * LANES * 2, kb2,
                scores.ctypes.data + (col + sb * LANES) * 4, width, scale_bits,
            )  # fmt: skip
    else:
        _qk_loop_f16(qh, k_cache, blk, kvh, np.float32(scale), scores, col)


def _q8_0_qk_block(fast, group, qh, k_cache, blk, kvh, scale, scale_bits, scores, col, width):  # noqa: ANN001, ANN202
    if fast:
        bs = k_cache.shape[4]
        base = k_cache.ctypes.data + blk * k_cache.strides[0] + kvh * k_cache.strides[1]
        for sb in range(bs // LANES):
            qk_q8_0_call(
                group, qh.ctypes.data, qh.shape[1], base + 2 * bs + sb * LANES, base + sb * LANES * 2, bs,
                scores.ctypes.data + (col + sb * LANES) * 4, width,
            )  # fmt: skip
    else:
        _qk_loop_q8_0(qh, k_cache, blk, kvh, scores, col)


def _f16_pv_rows(fast, group, scores, col, width, n, v_cache, blk, r0, kvh, acc):  # noqa: ANN001, ANN202
    if fast:
        dv = v_cache.shape[3]
        chunk = _pv_vectors(group) * LANES
        vs0, vs1, vs2 = v_cache.strides[0], v_cache.strides[1], v_cache.strides[2]
        row = v_cache.ctypes.data + blk * vs0 + r0 * vs1 + kvh * vs2
        for c0 in range(0, dv, chunk):
            pv_f16_call(
                group, scores.ctypes.data + col * 4, width, n, row + c0 * 2, v_cache.strides[1],
                acc.ctypes.data + c0 * 4, dv,
            )  # fmt: skip
    else:
        _pv_loop_f16(scores, col, n, v_cache, blk, r0, kvh, acc)


def _q8_0_pv_rows(fast, group, scores, col, width, n, v_cache, blk, r0, kvh, acc):  # noqa: ANN001, ANN202
    if fast:
        dv = v_cache.shape[3] * Q8_BLOCK
        chunk = _pv_vectors(group) * LANES
        vs0, vs1, vs2 = v_cache.strides[0], v_cache.strides[1], v_cache.strides[2]
        row = v_cache.ctypes.data + blk * vs0 + r0 * vs1 + kvh * vs2
        for c0 in range(0, dv, chunk):
            pv_q8_0_call(
                group, scores.ctypes.data + col * 4, width, n, row + c0 // Q8_BLOCK * v_cache.strides[3],
                v_cache.strides[1], acc.ctypes.data + c0 * 4, dv,
            )  # fmt: skip
    else:
        _pv_loop_q8_0(scores, col, n, v_cache, blk, r0, kvh, acc)


# cache element type -> (geometry, prepare_q, qk_block, pv_rows): uint16 f16 bits, uint8 q8_0 blocks
_KV_IMPLS = {
    types.uint16: (_f16_geometry, _f16_prepare_q, _f16_qk_block, _f16_pv_rows),
    types.uint8: (_q8_0_geometry, _q8_0_prepare_q, _q8_0_qk_block, _q8_0_pv_rows),
}


def _impl(cache, slot: int):  # noqa: ANN001, ANN202
    impls = _KV_IMPLS.get(getattr(cache, "dtype", None))
    return None if impls is None else impls[slot]


@overload(_kv_geometry, inline="always")
def _kv_geometry_typed(k_cache, v_cache):  # noqa: ANN001, ANN202
    return _impl(k_cache, 0)


@overload(_prepare_q, inline="always")
def _prepare_q_typed(k_cache, qh, scale):  # noqa: ANN001, ANN202
    return _impl(k_cache, 1)


@overload(_qk_block, inline="always")
def _qk_block_typed(fast, group, qh, k_cache, blk, kvh, scale, scale_bits, scores, col, width):  # noqa: ANN001, ANN202
    return _impl(k_cache, 2)


@overload(_pv_rows, inline="always")
def _pv_rows_typed(fast, group, scores, col, width, n, v_cache, blk, r0, kvh, acc):  # noqa: ANN001, ANN202
    return _impl(v_cache, 3)


@njit(cache=True, nogil=True, fastmath=SAFE_MATH, parallel=True)
def attention_paged_cpu(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    tok_seq: np.ndarray,
    tok_pos: np.ndarray,
    window: int,
    scale: float,
    softcap: float,
    sinks: np.ndarray,
    n_threads: int,
    out: np.ndarray,
) -> None:
    """Causal attention for a batch of tokens from different sequences, keys read through block tables.

    q: [T, H, d] (C-contiguous); k_cache / v_cache: one layer's cache in an f16 or q8_0 layout
    (attention_ir.py); block_tables: [S, max_blocks] int32; tok_seq[t]: row of block_tables for token t;
    tok_pos[t]: its position. Token t attends to positions max(0, pos - window + 1) .. pos of its sequence
    (window <= 0: no window). out: [T, H, dv]. softcap > 0: llama.cpp's order for a soft-capped model
    (Gemma 2), whose Q is scaled before attention and whose Q.K is capped before an unscaled softmax: Q
    times `scale` in f32, then rounded to f16, Q.K, cap * tanh(. / cap), softmax. Decode tokens and prefill
    chunks over cached prefixes are the same call. sinks: [H] float32 attention sinks (gpt-oss: head h's
    softmax has the extra logit sinks[h] in its denominator), or an empty array for none. The caller checks
    the shapes (CpuBackend: the cache was allocated for this model; sinks [H] or empty).
    """
    T, H, d = q.shape
    n_kv, bs, dv = _kv_geometry(k_cache, v_cache)
    group = H // n_kv
    chunk = _pv_vectors(group) * LANES
    fast = HALF_OPS_NATIVE and bs % LANES == 0 and dv % chunk == 0 and group <= MAX_GROUP and d > 0
    max_pos = 0
    for t in range(T):
        max_pos = max(max_pos, tok_pos[t])
    width = (max_pos // bs + 2) * bs  # scores columns: every block a token can touch
    q_scale = np.float32(scale) if softcap > 0 else np.float32(1.0)  # applied to Q before its f16 rounding
    kq_scale = np.float32(1.0) if softcap > 0 else np.float32(scale)  # applied to the Q.K sums
    sbits = np.empty(1, np.float32)
    sbits[0] = kq_scale
    scale_bits = np.int64(sbits.view(np.int32)[0])
    has_sinks = sinks.shape[0] > 0
    n_items = T * n_kv
    n_runs = min(n_items, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    for run in prange(n_runs):
        # scratch once per thread run: allocations per item would cost more than short items
        qh = np.empty((group, d), np.float32)
        scores = np.empty((group, width), np.float32)
        acc = np.empty((group, dv), np.float32)
        lo_item, hi_item = run * n_items // n_runs, (run + 1) * n_items // n_runs
        for idx in range(lo_item, hi_item):
            t = idx // n_kv
            kvh = idx % n_kv
            s = tok_seq[t]
            p = tok_pos[t]
            b0, nb, lo = item_blocks(p, window, bs)
            n = p - (b0 * bs + lo) + 1
            # Ask for blocks ahead only where they were not just read: a prefill chunk's tokens read the
            # same sequence's blocks, which its first token brought into the caches (asking again costs
            # its attention ~10%), while a decode batch's tokens each read their own sequence
            cold = seq_changes(tok_seq, t)
            if idx == lo_item and cold:  # later items' first blocks are asked for during the item before
                prefetch_item_k(k_cache, block_tables, tok_seq, tok_pos, window, bs, n_kv, idx, 0, PF_AHEAD)
            for g in range(group):
                for i in range(d):
                    qh[g, i] = q[t, kvh * group + g, i] * q_scale
                f16_round_inplace(qh[g])  # llama.cpp converts Q to f16 for the Q.K product
            _prepare_q(k_cache, qh, kq_scale)
            for b in range(nb):
                if cold and b + PF_AHEAD < nb:
                    prefetch_k(k_cache, block_tables[s, b0 + b + PF_AHEAD], kvh)
                elif cold and b + PF_AHEAD - nb < nb:  # the P.V's first blocks
                    prefetch_v(v_cache, block_tables[s, b0 + b + PF_AHEAD - nb], kvh)
                blk = block_tables[s, b0 + b]
                _qk_block(fast, group, qh, k_cache, blk, kvh, kq_scale, scale_bits, scores, b * bs, width)
            for g in range(group):
                sink = sinks[kvh * group + g] if has_sinks else np.float32(-np.inf)
                _softmax_f16_row(scores[g, lo : lo + n], softcap, sink)  # f16 weights, as llama.cpp's P.V
            acc[:] = 0.0
            for b in range(nb):
                blk = block_tables[s, b0 + b]
                r0 = lo if b == 0 else 0
                r1 = min(bs, p - (b0 + b) * bs + 1)
                if cold and b + PF_AHEAD < nb:
                    prefetch_v(v_cache, block_tables[s, b0 + b + PF_AHEAD], kvh)
                elif cold and idx + 1 < hi_item and seq_changes(tok_seq, (idx + 1) // n_kv):  # next item's K
                    ahead = b + PF_AHEAD - nb
                    prefetch_item_k(
                        k_cache, block_tables, tok_seq, tok_pos, window, bs, n_kv, idx + 1, ahead, ahead + 1
                    )
                _pv_rows(fast, group, scores, b * bs + r0, width, r1 - r0, v_cache, blk, r0, kvh, acc)
            for g in range(group):
                for i in range(dv):
                    out[t, kvh * group + g, i] = acc[g, i]


follow_sources(attention_paged_cpu)  # its machine code includes attention_ir.py's IR
