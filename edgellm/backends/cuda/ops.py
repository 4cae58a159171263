"""CUDA kernels for the row-wise and elementwise ops: RMSNorm (rows and per head), RoPE, gated
activations, residual and bias adds. Activations arrive as (flat buffer, offset, strides) of a DeviceTensor
view, so in-place ops see through the model's slices of the fused QKV output.

Each row reduction runs in one block with a fixed strided order and shared-memory tree, so a token's
result does not depend on its batch neighbours.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import ROW_THREADS, mul_rn


@cuda.jit(device=True, inline=True)
def _block_sum_f64(red, v):  # noqa: ANN001, ANN201
    """Sum of v over the block's threads (fixed tree); every thread gets the total."""
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    s = ROW_THREADS // 2
    while s > 0:
        if tid < s:
            red[tid] += red[tid + s]
        cuda.syncthreads()
        s //= 2
    total = red[0]
    cuda.syncthreads()
    return total


@cuda.jit
def rmsnorm_cuda(x, x_off, x_ld, w, eps, n, out, o_off, o_ld):  # noqa: ANN001
    """One block per row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (float64 sum as ggml). May alias."""
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    red = cuda.shared.array(ROW_THREADS, np.float64)
    acc = 0.0
    for i in range(tid, n, ROW_THREADS):
        v = np.float64(x[x_off + r * x_ld + i])
        acc += v * v
    total = _block_sum_f64(red, acc)
    scale = np.float32(1.0 / math.sqrt(total / n + eps))
    for i in range(tid, n, ROW_THREADS):
        out[o_off + r * o_ld + i] = mul_rn(mul_rn(x[x_off + r * x_ld + i], scale), w[i])


@cuda.jit
def rmsnorm_heads_cuda(x, off, st, sh, n_heads, w, eps, d):  # noqa: ANN001
    """One block per (token, head), in place over [T, H, d] with a [d] weight (Q/K norm)."""
    t = cuda.blockIdx.x // n_heads
    h = cuda.blockIdx.x % n_heads
    tid = cuda.threadIdx.x
    base = off + t * st + h * sh
    red = cuda.shared.array(ROW_THREADS, np.float64)
    acc = 0.0
    for i in range(tid, d, ROW_THREADS):
        v = np.float64(x[base + i])
        acc += v * v
    total = _block_sum_f64(red, acc)
    scale = np.float32(1.0 / math.sqrt(total / d + eps))
    for i in range(tid, d, ROW_THREADS):
        x[base + i] = mul_rn(mul_rn(x[base + i], scale), w[i])


@cuda.jit
def rope_cuda(x, off, st, sh, n_tokens, n_heads, pos, n_rot, base, neox):  # noqa: ANN001
    """In place over [T, H, d]; one thread per (token, head, rotated pair). theta_i = pos * base^(-2i/n_rot);
    neox pairs (i, i + n_rot/2), otherwise adjacent pairs (2i, 2i+1), as llama.cpp."""
    half = n_rot // 2
    for idx in range(cuda.grid(1), n_tokens * n_heads * half, cuda.gridsize(1)):  # grid-stride
        i = idx % half
        h = (idx // half) % n_heads
        t = idx // (half * n_heads)
        theta = np.float64(pos[t]) * base ** (-2.0 * i / n_rot)
        c = np.float32(math.cos(theta))
        s = np.float32(math.sin(theta))
        if neox:
            a = i
            b = i + half
        else:
            a = 2 * i
            b = 2 * i + 1
        p = off + t * st + h * sh
        x0 = x[p + a]
        x1 = x[p + b]
        x[p + a] = mul_rn(x0, c) - mul_rn(x1, s)
        x[p + b] = mul_rn(x0, s) + mul_rn(x1, c)


@cuda.jit
def gated_act_cuda(g, g_off, g_ld, out, o_off, o_ld, n_tokens, ff, gelu):  # noqa: ANN001
    """out = act(gate) * up over gate_up = [gate | up]: SiLU (SwiGLU) or tanh-GELU (GeGLU)."""
    for idx in range(cuda.grid(1), n_tokens * ff, cuda.gridsize(1)):  # grid-stride
        t = idx // ff
        i = idx % ff
        gv = g[g_off + t * g_ld + i]
        up = g[g_off + t * g_ld + ff + i]
        if gelu:
            c = np.float32(math.sqrt(2.0 / math.pi))
            inner = mul_rn(c, gv + mul_rn(mul_rn(mul_rn(np.float32(0.044715), gv), gv), gv))
            act = mul_rn(mul_rn(np.float32(0.5), gv), np.float32(1.0) + math.tanh(inner))
        else:
            act = gv / (np.float32(1.0) + math.exp(-gv))
        out[o_off + t * o_ld + i] = mul_rn(act, up)


@cuda.jit
def add_cuda(x, x_off, x_ld, y, y_off, y_ld, n_rows, n, y_is_bias):  # noqa: ANN001
    """x[t] += y[t] (residual), or x[t] += y (bias) when y_is_bias."""
    for idx in range(cuda.grid(1), n_rows * n, cuda.gridsize(1)):  # grid-stride
        t = idx // n
        i = idx % n
        yv = y[y_off + i] if y_is_bias else y[y_off + t * y_ld + i]
        x[x_off + t * x_ld + i] += yv


@cuda.jit
def copy_strided_cuda(x, off, st, sh, n_tokens, n_heads, d, out):  # noqa: ANN001
    """out (contiguous [T, H, d]) = a strided [T, H, d] view with unit inner stride."""
    for idx in range(cuda.grid(1), n_tokens * n_heads * d, cuda.gridsize(1)):  # grid-stride
        i = idx % d
        h = (idx // d) % n_heads
        t = idx // (d * n_heads)
        out[idx] = x[off + t * st + h * sh + i]


@cuda.jit
def take_rows_cuda(x, x_off, x_ld, rows, n, out):  # noqa: ANN001
    """out (contiguous [L, n]) = x[rows]: the rows that need logits, gathered without a trip to the host."""
    for idx in range(cuda.grid(1), rows.shape[0] * n, cuda.gridsize(1)):  # grid-stride
        out[idx] = x[x_off + rows[idx // n] * x_ld + idx % n]
