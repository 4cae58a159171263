"""Numba CPU kernels for everything but the matmuls and attention (attention.py): norms, rotary
embedding, gated activations, residual adds and KV-cache writes.

Every kernel works row by row with a fixed reduction order, so a token's result never depends on which
other tokens share the batch (the serving engine's determinism rests on that).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from edgellm.backends.cpu.fp16 import HOST_F16C, f32_to_f16_bits
from edgellm.backends.cpu.ir_util import fma_f32
from edgellm.backends.cpu.layernorm_gelu import gelu_lookup
from edgellm.gguf.rope import RopeParams

# fastmath without 'nnan'/'ninf': softmax uses -inf and exp underflow (see shared notes, pitfall 6).
SAFE_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _sum_squares(x: np.ndarray) -> float:
    """sum(x[i] * x[i]) of a float32 row: float32 squares summed in float64 (ggml_float), as ggml's norms.
    The summation order is left to the vectoriser: a float64 sum of <= 2^16 float32 squares is accurate far
    below the float32 rounding of the mean that follows."""
    acc = 0.0
    for i in range(x.shape[0]):
        acc += x[i] * x[i]
    return acc


@njit(cache=True, nogil=True)
def _rms_scale(acc: float, n: int, eps: float) -> np.float32:
    """ggml's rms_norm scale, in its roundings: mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps).
    No fast-math here: 'afn'/'arcp' would let LLVM turn 1 / sqrt into an approximate rsqrt."""
    mean = np.float32(acc / n)
    return np.float32(1.0) / np.sqrt(mean + np.float32(eps))


@njit(cache=True, nogil=True)
def _scale_row(x: np.ndarray, scale: np.float32, w: np.ndarray, out: np.ndarray) -> None:
    """out = (x * scale) * w, two float32 products in this order (ggml_vec_scale_f32, then ggml_mul)."""
    for i in range(x.shape[0]):
        out[i] = (x[i] * scale) * w[i]


@njit(cache=True, nogil=True)
def rmsnorm_cpu(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, bit for bit as ggml's rms_norm then mul.  x, out: [R, n];
    w: [n]. out may alias x."""
    rows, n = x.shape
    for r in range(rows):
        _scale_row(x[r], _rms_scale(_sum_squares(x[r]), n, eps), w, out[r])


@njit(cache=True, nogil=True)
def rmsnorm_heads_cpu(x: np.ndarray, w: np.ndarray, eps: float) -> None:
    """In-place per-head RMSNorm (Q/K norm), as rmsnorm_cpu per head. x: [T, H, d]; w: [d]."""
    T, H, d = x.shape
    for t in range(T):
        for h in range(H):
            _scale_row(x[t, h], _rms_scale(_sum_squares(x[t, h]), d, eps), w, x[t, h])


@njit(cache=True, nogil=True)
def rope_table_cpu(
    n_pos: int,
    n_rot: int,
    base: float,
    freq_factors: np.ndarray,
    freq_scale: float,
    ext_factor: float,
    ramp: np.ndarray,
    mscale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [n_pos, n_rot/2] (f32) as ggml-cpu's rope cache (ggml_rope_cache_init / rope_yarn), in its
    float32 roundings: theta_scale = powf(base, -2.0f / n_rot); at position p, theta starts at (float)p and
    is multiplied by theta_scale from one pair to the next (the products' rounding accumulates: at p ~ 1,000
    it moves theta by ~1e-4 from the exact p * base^(-2i/n_rot), which the table must follow, not correct);
    per pair theta / freq_factor, times freq_scale, YaRN's mix fma(interp, 1 - mix, extrap * mix) with
    mix = ramp * ext_factor, then cosf / sinf times mscale. No fast-math: every rounding is ggml's.
    The backend keeps one table per RopeParams instead of recomputing per call."""
    half = n_rot // 2
    f32 = np.float32
    theta_scale = f32(base) ** (f32(-2.0) / f32(n_rot))
    fs, ext, ms = f32(freq_scale), f32(ext_factor), f32(mscale)
    cos_t = np.empty((n_pos, half), np.float32)
    sin_t = np.empty((n_pos, half), np.float32)
    for p in range(n_pos):
        theta = f32(p)
        for i in range(half):
            extrap = theta / freq_factors[i]
            t = fs * extrap
            if ext != f32(0.0):
                mix = ramp[i] * ext
                t = fma_f32(t, f32(1.0) - mix, extrap * mix)
            cos_t[p, i] = math.cos(t) * ms
            sin_t[p, i] = math.sin(t) * ms
            theta = theta * theta_scale
    return cos_t, sin_t


def rope_tables(n_pos: int, rope: RopeParams) -> tuple[np.ndarray, np.ndarray]:
    """rope_table_cpu for `rope`: cos/sin [n_pos, n_rot/2]."""
    ff, fs, ext, ramp = rope.table_args()
    return rope_table_cpu(n_pos, rope.n_rot, float(rope.base), ff, fs, ext, ramp, float(rope.mscale))


def rope_cpu(x: np.ndarray, pos: np.ndarray, rope: RopeParams) -> None:
    """rope_table_cpu + rope_cached_cpu in one call (the backend keeps its tables instead)."""
    cos_t, sin_t = rope_tables(int(pos.max()) + 1 if len(pos) else 1, rope)
    rope_cached_cpu(x, pos, cos_t, sin_t, rope.neox)


@njit(cache=True, nogil=True)
def rope_cached_cpu(x: np.ndarray, pos: np.ndarray, cos_t: np.ndarray, sin_t: np.ndarray, neox: bool) -> None:
    """In-place rotary embedding. x: [T, H, d]; pos: [T] int32; cos_t/sin_t: rope_table_cpu rows by
    position (n_rot = 2 * their width; dims past n_rot are left as they are).

    neox=False rotates adjacent pairs (x[2i], x[2i+1]); neox=True rotates (x[i], x[i + n_rot/2]).
    The fused multiply-adds are explicit, those of ggml-cpu's rotate_pairs as GCC contracts it
    (x0*cos - x1*sin -> fma(x0, cos, -(x1*sin)), x0*sin + x1*cos -> fma(x0, sin, x1*cos)), so the bits are
    llama.cpp's and the same wherever the kernel is compiled in (layer.py's fused layer, a call from Python).
    """
    T, H, d = x.shape
    half = cos_t.shape[1]
    for t in range(T):
        p = pos[t]
        for h in range(H):
            for i in range(half):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = fma_f32(x0, cos_t[p, i], -(x1 * sin_t[p, i]))
                x[t, h, b] = fma_f32(x0, sin_t[p, i], x1 * cos_t[p, i])


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _swiglu_row(gate_up: np.ndarray, out: np.ndarray, t: int) -> None:
    ff = out.shape[1]
    for i in range(ff):
        g = gate_up[t, i]
        out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, ff + i]


@njit(cache=True, nogil=True, inline="always")
def _geglu_row(gate_up: np.ndarray, out: np.ndarray, t: int) -> None:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16, always defined): 0 where gate <= -10, gate * up where gate >= 10,
    else ggml's f16 GELU table at gate's f16 bits times up, one float32 product (layernorm_gelu.py)."""
    ff = out.shape[1]
    for i in range(ff):
        g = gate_up[t, i]
        if g <= np.float32(-10.0):
            out[t, i] = np.float32(0.0)
        else:
            out[t, i] = gelu_lookup(g) * gate_up[t, ff + i]


# Gated activations: out = act(gate) * up for gate_up = [gate | up] ([T, 2*ff] -> [T, ff]); SwiGLU (silu)
# or GeGLU (gelu from ggml's table, Gemma). A serial driver for a few rows (a parallel region costs more than
# the work at decode) and a row-parallel one for prefill and big batches.
@njit(cache=True, nogil=True, fastmath=True)
def swiglu_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in range(out.shape[0]):
        _swiglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, fastmath=True, parallel=True)
def swiglu_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        _swiglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, parallel=True)
def geglu_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        _geglu_row(gate_up, out, t)


# gpt-oss's clamped SwiGLU (ggml's swiglu_oai with llama.cpp's alpha and limit)
OAI_ALPHA = np.float32(1.702)
OAI_LIMIT = np.float32(7.0)


@njit(cache=True, nogil=True, parallel=True)
def swiglu_oai_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    """out = g * sigmoid(1.702 g) * (u + 1) with g = min(gate, 7), u = clamp(up, -7, 7), for gate_up =
    [gate | up] [T, 2n], out [T, n]: ggml_compute_forward_swiglu_oai_f32's float32 steps, no fast-math."""
    n = out.shape[1]
    one = np.float32(1.0)
    for t in prange(out.shape[0]):
        for i in range(n):
            x = min(gate_up[t, i], OAI_LIMIT)
            y = min(max(gate_up[t, n + i], -OAI_LIMIT), OAI_LIMIT)
            out[t, i] = x / (one + np.exp(OAI_ALPHA * -x)) * (y + one)


def _as_f16_bits(x):  # noqa: ANN001, ANN202 (typed by the overload below)
    raise NotImplementedError("only called from Numba code")


@overload(_as_f16_bits, inline="always")
def _as_f16_bits_typed(x):  # noqa: ANN001, ANN202
    """f32 -> f16 bits with vcvtps2ph (only ever compiled for f32 on F16C hosts); f16 bits pass through."""
    if isinstance(x, types.Float):
        return lambda x: f32_to_f16_bits(x)
    return lambda x: x


@njit(cache=True, nogil=True)
def write_kv_slots_cpu(k, v, k_cache, v_cache, slots) -> None:
    """Scatter each token's K/V (f32, converted here, or f16 bits already) to its cache slot."""
    bs = v_cache.shape[1]
    for t in range(k.shape[0]):
        blk = slots[t] // bs
        off = slots[t] % bs
        for h in range(k.shape[1]):
            for i in range(k.shape[2]):
                k_cache[blk, h, i, off] = _as_f16_bits(k[t, h, i])
            for i in range(v.shape[2]):
                v_cache[blk, off, h, i] = _as_f16_bits(v[t, h, i])


def write_kv_cpu(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots: np.ndarray
) -> None:
    """Store each token's K/V at its cache slot as f16 (uint16 bits, round to nearest even), as
    llama.cpp's f16 cache holds them. k: [T, Hkv, d] f32; k_cache: [n_blocks, Hkv, d, block_size] (keys
    transposed per block, see attention.py); v_cache: [n_blocks, block_size, Hkv, dv]; slots[t] =
    block * block_size + offset. With F16C the conversion is an instruction inside the scatter (numpy's
    cast took ~5 us per call here); elsewhere numpy converts."""
    slots = np.asarray(slots, dtype=np.int64)
    if not HOST_F16C:
        with np.errstate(over="ignore"):  # |x| >= 65520 becomes inf, as in llama.cpp's f16 cache
            k, v = k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    write_kv_slots_cpu(k, v, k_cache, v_cache, slots)


@njit(cache=True, nogil=True, fastmath=True)
def add_cpu(x: np.ndarray, y: np.ndarray) -> None:
    """x += y, both [T, n]."""
    T, n = x.shape
    for t in range(T):
        for i in range(n):
            x[t, i] += y[t, i]
