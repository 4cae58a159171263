"""Numba CPU kernels of the LayerNorm architectures (StarCoder 2, GPT-2): LayerNorm with weight and bias,
and GELU as ggml computes it for float32 (also what Gemma's GeGLU reads, ops.py).

ggml's float32 GELU (ggml-cpu vec.h, GGML_GELU_FP16, always defined) does not evaluate the formula on the
float32 input: it rounds the input to f16 and reads a 65,536-entry f16 table of the tanh form
0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), except 0 at x <= -10 and x itself at x >= 10. Here the
table is built the same way at import: the formula in float32 as ggml's build evaluates it (1 + a x^2 one
fused multiply-add: its table differs from the unfused form at one entry) on every f16 value, the result
rounded to f16 (tests/kernels/test_backend_ops.py compares it with llama.cpp's table bit for bit).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from edgellm.backends.cpu.fp16 import f16_bits_to_f32, f16_round, f32_to_f16_bits_any
from edgellm.backends.cpu.ir_util import fma_f32

GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


@njit(cache=True, nogil=True, inline="always")
def _gelu_entry(v: np.float32) -> np.float32:
    """The table's entry for an f16 value v: the tanh form in float32 as ggml's build evaluates it (see
    the module doc), rounded to f16."""
    inner = SQRT_2_OVER_PI * v * fma_f32(GELU_COEF_A * v, v, np.float32(1.0))
    return f16_round(np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.tanh(inner))))


@njit(cache=True, nogil=True)
def _gelu_table_f32() -> np.ndarray:
    """ggml_table_gelu_f16 widened to float32: entry b for the f16 value with bits b (the non-finite
    entries 0: never read, the +-10 cut-offs come first)."""
    table = np.zeros(1 << 16, np.float32)
    for b in range(1 << 16):
        v = f16_bits_to_f32(np.uint16(b))
        if np.isfinite(v):
            table[b] = _gelu_entry(v)
    return table


# 256 KB, built once per process (~2 ms): a lookup costs a fraction of the tanh it replaces, which was a
# quarter of Gemma 3's prefill (its GeGLU runs on every FFN row)
GELU_F32 = _gelu_table_f32()


@njit(cache=True, nogil=True, inline="always")
def gelu_lookup(x: np.float32) -> np.float32:
    """ggml's float32 GELU of one value: 0 at x <= -10, x at x >= 10, else the table's entry at x's f16
    bits."""
    if x <= np.float32(-10.0):
        return np.float32(0.0)
    if x >= np.float32(10.0):
        return x
    return GELU_F32[f32_to_f16_bits_any(x)]


@njit(cache=True, nogil=True, parallel=True)
def gelu_cpu(x: np.ndarray) -> None:
    """In place over x [T, n] (rows in parallel; a row's bits do not depend on the others)."""
    T, n = x.shape
    for t in prange(T):
        for i in range(n):
            x[t, i] = gelu_lookup(x[t, i])


@njit(cache=True, nogil=True, parallel=True)
def layernorm_cpu(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, in ggml_norm's order: float64 sums of x and of the
    float32 squares (x - mean)^2, mean and variance rounded to float32, then the weight's multiply and the
    bias's add (ggml_mul, ggml_add). x, out: [R, n] (out may alias x); w, b: [n]."""
    rows, n = x.shape
    eps32 = np.float32(eps)
    for r in prange(rows):
        s = 0.0
        for i in range(n):
            s += np.float64(x[r, i])
        mean = np.float32(s / n)
        s2 = 0.0
        for i in range(n):
            v = x[r, i] - mean
            s2 += np.float64(v * v)
        var = np.float32(s2 / n)
        scale = np.float32(1.0) / np.float32(math.sqrt(var + eps32))
        for i in range(n):
            out[r, i] = (x[r, i] - mean) * scale * w[i] + b[i]
