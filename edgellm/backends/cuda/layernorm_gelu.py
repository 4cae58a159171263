"""CUDA kernels of the LayerNorm architectures (StarCoder 2, GPT-2): LayerNorm with weight and bias, and
ggml's float32 GELU (the f16-rounded input and result of its table; cpu/layernorm_gelu.py explains it),
in the CPU kernels' order. Arguments are (flat buffer, offset, row stride) of DeviceTensor views."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import ROW_THREADS, SIMULATOR, f16_round, mul_rn
from edgellm.backends.cuda.ops import block_sum_f64

if SIMULATOR:

    def fma_rn(a, b, c):  # noqa: ANN001, ANN202 - simulator stand-in for libdevice's fmaf
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))

else:  # pragma: no cover - needs a GPU
    from numba.cuda.libdevice import fmaf as fma_rn

GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


@cuda.jit(cache=True)
def layernorm_cuda(x, x_off, x_ld, w, b, eps, n, out, o_off, o_ld):  # noqa: ANN001
    """One block per row: out[r] = (x[r] - mean) / sqrt(var + eps) * w + b (float64 sums, float32 mean and
    variance, as ggml_norm). May alias: each thread reads only the elements it writes."""
    base, o_base = x_off + cuda.blockIdx.x * x_ld, o_off + cuda.blockIdx.x * o_ld
    red = cuda.shared.array(ROW_THREADS, np.float64)
    acc = 0.0
    for i in range(cuda.threadIdx.x, n, ROW_THREADS):
        acc += np.float64(x[base + i])
    mean = np.float32(block_sum_f64(red, acc) / n)
    acc = 0.0
    for i in range(cuda.threadIdx.x, n, ROW_THREADS):
        v = x[base + i] - mean
        acc += np.float64(mul_rn(v, v))
    var = np.float32(block_sum_f64(red, acc) / n)
    scale = np.float32(1.0) / np.float32(math.sqrt(var + np.float32(eps)))
    for i in range(cuda.threadIdx.x, n, ROW_THREADS):
        out[o_base + i] = mul_rn(mul_rn(x[base + i] - mean, scale), w[i]) + b[i]


@cuda.jit(device=True, inline=True)
def gelu_f16_table(x):  # noqa: ANN001, ANN201
    if x <= np.float32(-10.0):
        return np.float32(0.0)
    if x >= np.float32(10.0):
        return x
    v = f16_round(x)
    inner = mul_rn(mul_rn(SQRT_2_OVER_PI, v), fma_rn(mul_rn(GELU_COEF_A, v), v, np.float32(1.0)))
    return f16_round(mul_rn(mul_rn(np.float32(0.5), v), np.float32(1.0) + math.tanh(inner)))


@cuda.jit(cache=True)
def gelu_cuda(x, x_off, x_ld, n_rows, n):  # noqa: ANN001
    """In place over a [T, n] view."""
    for idx in range(cuda.grid(1), n_rows * n, cuda.gridsize(1)):  # grid-stride
        p = x_off + (idx // n) * x_ld + idx % n
        x[p] = gelu_f16_table(x[p])
