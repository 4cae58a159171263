"""Numba CPU kernels for everything but the matmuls: norms, rotary embedding, gated activations,
KV-cache writes and paged attention.

Every kernel works row by row with a fixed reduction order, so a token's result never depends on which
other tokens share the batch (the serving engine's determinism rests on that).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from edgellm.backends.cpu.fp16 import f16_round_inplace

# fastmath without 'nnan'/'ninf': softmax uses -inf and exp underflow (see shared notes, pitfall 6).
SAFE_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def rmsnorm_cpu(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w.  x, out: [R, n]; w: [n]. out may alias x."""
    rows, n = x.shape
    for r in range(rows):
        acc = 0.0  # float64 accumulation, as ggml does
        for i in range(n):
            acc += x[r, i] * x[r, i]
        scale = np.float32(1.0 / math.sqrt(acc / n + eps))
        for i in range(n):
            out[r, i] = x[r, i] * scale * w[i]


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def rmsnorm_heads_cpu(x: np.ndarray, w: np.ndarray, eps: float) -> None:
    """In-place per-head RMSNorm (Q/K norm). x: [T, H, d]; w: [d]."""
    T, H, d = x.shape
    for t in range(T):
        for h in range(H):
            acc = 0.0
            for i in range(d):
                acc += x[t, h, i] * x[t, h, i]
            scale = np.float32(1.0 / math.sqrt(acc / d + eps))
            for i in range(d):
                x[t, h, i] = x[t, h, i] * scale * w[i]


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def rope_cpu(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool) -> None:
    """In-place rotary embedding. x: [T, H, d]; pos: [T] int32.

    neox=False rotates adjacent pairs (x[2i], x[2i+1]); neox=True rotates (x[i], x[i + n_rot/2]).
    theta_i = pos * base^(-2i/n_rot), as llama.cpp.
    """
    T, H, d = x.shape
    half = n_rot // 2
    cos_t = np.empty(half, np.float32)
    sin_t = np.empty(half, np.float32)
    for t in range(T):
        p = float(pos[t])
        for i in range(half):
            theta = p * base ** (-2.0 * i / n_rot)
            cos_t[i] = math.cos(theta)
            sin_t[i] = math.sin(theta)
        for h in range(H):
            for i in range(half):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = x0 * cos_t[i] - x1 * sin_t[i]
                x[t, h, b] = x0 * sin_t[i] + x1 * cos_t[i]


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _swiglu_row(gate_up: np.ndarray, out: np.ndarray, t: int) -> None:
    ff = out.shape[1]
    for i in range(ff):
        g = gate_up[t, i]
        out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, ff + i]


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _geglu_row(gate_up: np.ndarray, out: np.ndarray, t: int) -> None:
    ff = out.shape[1]
    c = np.float32(math.sqrt(2.0 / math.pi))
    for i in range(ff):
        g = gate_up[t, i]
        gl = np.float32(0.5) * g * (np.float32(1.0) + np.tanh(c * (g + np.float32(0.044715) * g * g * g)))
        out[t, i] = gl * gate_up[t, ff + i]


# Gated activations: out = act(gate) * up for gate_up = [gate | up] ([T, 2*ff] -> [T, ff]); SwiGLU (silu)
# or GeGLU (gelu, tanh form, Gemma). A serial driver for a few rows (a parallel region costs more than
# the work at decode) and a row-parallel one for prefill and big batches.
@njit(cache=True, nogil=True, fastmath=True)
def swiglu_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in range(out.shape[0]):
        _swiglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def swiglu_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        _swiglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, fastmath=True)
def geglu_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in range(out.shape[0]):
        _geglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def geglu_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        _geglu_row(gate_up, out, t)


@njit(cache=True, nogil=True)
def write_kv_cpu(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray
) -> None:
    """Store each token's K/V at its cache slot, rounded to f16 values as llama.cpp's f16 cache holds
    them. k: [T, Hkv, d]; k_cache: [n_blocks, block_size, Hkv, d]; slots[t] = block * block_size + offset."""
    bs = k_cache.shape[1]
    for t in range(k.shape[0]):
        blk = slots[t] // bs
        off = slots[t] % bs
        for h in range(k.shape[1]):
            krow = k_cache[blk, off, h]
            krow[:] = k[t, h]
            f16_round_inplace(krow)
            vrow = v_cache[blk, off, h]
            vrow[:] = v[t, h]
            f16_round_inplace(vrow)


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
    out: np.ndarray,
) -> None:
    """Causal attention for a batch of tokens from different sequences, keys read through block tables.

    q: [T, H, d]; k_cache/v_cache: [n_blocks, block_size, Hkv, d]; block_tables: [S, max_blocks] int32;
    tok_seq[t]: row of block_tables for token t; tok_pos[t]: its position. Token t attends to positions
    max(0, pos - window + 1) .. pos of its sequence (window <= 0: no window). out: [T, H, dv].
    Decode tokens and prefill chunks over cached prefixes are the same call.
    """
    T, H, d = q.shape
    bs = k_cache.shape[1]
    n_kv = k_cache.shape[2]
    dv = v_cache.shape[3]
    group = H // n_kv
    # One work item per (token, KV head): each K/V row is read once for the `group` query heads sharing
    # it. Plain indexing only: slicing inside a prange body costs reference-count atomics (shared notes).
    for idx in prange(T * n_kv):
        t = idx // n_kv
        kvh = idx % n_kv
        s = tok_seq[t]
        p = tok_pos[t]
        start = 0
        if window > 0 and p - window + 1 > 0:
            start = p - window + 1
        n = p - start + 1
        qh = np.empty((group, d), np.float32)
        for g in range(group):
            for i in range(d):
                qh[g, i] = q[t, kvh * group + g, i]
            f16_round_inplace(qh[g])  # llama.cpp converts Q to f16 for the Q.K product
        scores = np.empty((group, n), np.float32)
        for j in range(n):
            kp = start + j
            blk = block_tables[s, kp // bs]
            off = kp % bs
            for g in range(group):
                acc = np.float32(0.0)
                for i in range(d):
                    acc += qh[g, i] * k_cache[blk, off, kvh, i]
                scores[g, j] = acc * scale
        acc_v = np.zeros((group, dv), np.float32)
        for g in range(group):
            m = np.float32(-np.inf)
            for j in range(n):
                m = max(m, scores[g, j])
            total = 0.0  # float64 sum of float32 expf values, as ggml's softmax
            for j in range(n):
                e = np.exp(scores[g, j] - m)  # float32 (a float64 exp here cost ~60% of attention)
                scores[g, j] = e
                total += e
            inv = np.float32(1.0 / total)
            for j in range(n):
                scores[g, j] *= inv
            f16_round_inplace(scores[g])  # llama.cpp multiplies V by f16 softmax weights
        for j in range(n):
            kp = start + j
            blk = block_tables[s, kp // bs]
            off = kp % bs
            for g in range(group):
                w = scores[g, j]
                for i in range(dv):
                    acc_v[g, i] += w * v_cache[blk, off, kvh, i]
        for g in range(group):
            for i in range(dv):
                out[t, kvh * group + g, i] = acc_v[g, i]


@njit(cache=True, nogil=True, fastmath=True)
def add_cpu(x: np.ndarray, y: np.ndarray) -> None:
    """x += y, both [T, n]."""
    T, n = x.shape
    for t in range(T):
        for i in range(n):
            x[t, i] += y[t, i]
