"""CUDA kernels of the LayerNorm architectures (StarCoder 2, GPT-2): LayerNorm with weight and bias, and
ggml's float32 GELU (gelu.py), in the CPU kernels' order. Arguments are (flat buffer, offset, row stride)
of DeviceTensor views."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import ROW_THREADS, mul_rn
from edgellm.backends.cuda.gelu import gelu_f16_table
from edgellm.backends.cuda.ops import block_sum_f64


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


@cuda.jit(cache=True)
def gelu_cuda(x, x_off, x_ld, n_rows, n):  # noqa: ANN001
    """In place over a [T, n] view."""
    for idx in range(cuda.grid(1), n_rows * n, cuda.gridsize(1)):  # grid-stride
        p = x_off + (idx // n) * x_ld + idx % n
        x[p] = gelu_f16_table(x[p])
