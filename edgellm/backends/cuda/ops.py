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
from edgellm.backends.cuda.gelu import gelu_f16_table


@cuda.jit(device=True, inline=True)
def block_sum_f64(red, v):  # noqa: ANN001, ANN201
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


@cuda.jit(device=True, inline=True)
def rms_scale(x, base, n, eps, red):  # noqa: ANN001, ANN201
    """1 / sqrt(mean(x[base : base + n]^2) + eps) for the block's row (float64 sum as ggml); each thread
    reads the elements tid, tid + ROW_THREADS, ... (the ones it may have just written itself)."""
    acc = 0.0
    for i in range(cuda.threadIdx.x, n, ROW_THREADS):
        v = np.float64(x[base + i])
        acc += v * v
    total = block_sum_f64(red, acc)
    return np.float32(1.0 / math.sqrt(total / n + eps))


@cuda.jit(device=True, inline=True)
def scale_row(x, x_base, scale, w, n, out, o_base):  # noqa: ANN001
    """out[o_base + i] = x[x_base + i] * scale * w[i] over this thread's elements (may alias)."""
    for i in range(cuda.threadIdx.x, n, ROW_THREADS):
        out[o_base + i] = mul_rn(mul_rn(x[x_base + i], scale), w[i])


@cuda.jit(cache=True)
def rmsnorm_cuda(x, x_off, x_ld, w, eps, n, out, o_off, o_ld):  # noqa: ANN001
    """One block per row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w. May alias."""
    r = cuda.blockIdx.x
    red = cuda.shared.array(ROW_THREADS, np.float64)
    scale = rms_scale(x, x_off + r * x_ld, n, eps, red)
    scale_row(x, x_off + r * x_ld, scale, w, n, out, o_off + r * o_ld)


@cuda.jit(cache=True)
def rmsnorm_heads_cuda(x, off, st, sh, n_heads, w, eps, d):  # noqa: ANN001
    """One block per (token, head), in place over [T, H, d] with a [d] weight (Q/K norm)."""
    base = off + (cuda.blockIdx.x // n_heads) * st + (cuda.blockIdx.x % n_heads) * sh
    red = cuda.shared.array(ROW_THREADS, np.float64)
    scale = rms_scale(x, base, d, eps, red)
    scale_row(x, base, scale, w, d, x, base)


@cuda.jit(device=True, inline=True)
def rope_pair(x, p, i, pos, inv_freq, mscale, n_rot, neox):  # noqa: ANN001, ANN201
    """Rotate pair i of the head at x[p:]: theta_i = pos * inv_freq[i] (float64, RopeParams.inv_freq: the
    base, frequency factors and scaling folded in), cos/sin times mscale; neox pairs (i, i + n_rot/2),
    otherwise adjacent pairs (2i, 2i+1), as llama.cpp. Returns the pair's element indexes."""
    theta = np.float64(pos) * inv_freq[i]
    c = np.float32(math.cos(theta) * mscale)
    s = np.float32(math.sin(theta) * mscale)
    if neox:
        a = i
        b = i + n_rot // 2
    else:
        a = 2 * i
        b = 2 * i + 1
    x0 = x[p + a]
    x1 = x[p + b]
    x[p + a] = mul_rn(x0, c) - mul_rn(x1, s)
    x[p + b] = mul_rn(x0, s) + mul_rn(x1, c)
    return a, b


@cuda.jit(cache=True)
def rope_cuda(x, off, st, sh, n_tokens, n_heads, pos, inv_freq, mscale, neox):  # noqa: ANN001
    """In place over [T, H, d]; one thread per (token, head, rotated pair); inv_freq: float64 [n_rot/2]."""
    half = inv_freq.shape[0]
    for idx in range(cuda.grid(1), n_tokens * n_heads * half, cuda.gridsize(1)):  # grid-stride
        h = (idx // half) % n_heads
        t = idx // (half * n_heads)
        rope_pair(x, off + t * st + h * sh, idx % half, pos[t], inv_freq, mscale, 2 * half, neox)


# Backend.gated_act's kinds -> the `act` argument of the gated kernels (gated below)
GATED_ACTS = {"silu": 0, "gelu": 1, "swiglu_oai": 2}
OAI_ALPHA = np.float32(1.702)  # gpt-oss's swiglu_oai: llama.cpp's alpha and limit
OAI_LIMIT = np.float32(7.0)


@cuda.jit(device=True, inline=True)
def gated(gv, up, act):  # noqa: ANN001, ANN201
    """act(gate) * up, act a GATED_ACTS value: SiLU (SwiGLU), ggml's table GELU (GeGLU as ggml_vec_geglu_f32:
    0 where gate <= -10, whatever up is), or gpt-oss's clamped
    SwiGLU g * sigmoid(1.702 g) * (u + 1), g = min(gate, 7), u = clamp(up, -7, 7) (the CPU kernel's
    float32 steps)."""
    if act == 1:
        if gv <= np.float32(-10.0):
            return np.float32(0.0)
        a = gelu_f16_table(gv)
    elif act == 2:
        g = min(gv, OAI_LIMIT)
        a = g / (np.float32(1.0) + math.exp(mul_rn(OAI_ALPHA, -g)))
        return mul_rn(a, min(max(up, -OAI_LIMIT), OAI_LIMIT) + np.float32(1.0))
    else:
        a = gv / (np.float32(1.0) + math.exp(-gv))
    return mul_rn(a, up)


@cuda.jit(cache=True)
def gated_act_cuda(g, g_off, g_ld, out, o_off, o_ld, n_tokens, ff, act):  # noqa: ANN001
    """out = act(gate) * up over gate_up = [gate | up]; act: a GATED_ACTS value."""
    for idx in range(cuda.grid(1), n_tokens * ff, cuda.gridsize(1)):  # grid-stride
        t = idx // ff
        i = idx % ff
        out[o_off + t * o_ld + i] = gated(g[g_off + t * g_ld + i], g[g_off + t * g_ld + ff + i], act)


@cuda.jit(cache=True)
def add_cuda(x, x_off, x_ld, y, y_off, y_ld, n_rows, n, y_is_bias):  # noqa: ANN001
    """x[t] += y[t] (residual), or x[t] += y (bias) when y_is_bias."""
    for idx in range(cuda.grid(1), n_rows * n, cuda.gridsize(1)):  # grid-stride
        t = idx // n
        i = idx % n
        yv = y[y_off + i] if y_is_bias else y[y_off + t * y_ld + i]
        x[x_off + t * x_ld + i] += yv


@cuda.jit(cache=True)
def copy_strided_cuda(x, off, st, sh, n_tokens, n_heads, d, out):  # noqa: ANN001
    """out (contiguous [T, H, d]) = a strided [T, H, d] view with unit inner stride."""
    for idx in range(cuda.grid(1), n_tokens * n_heads * d, cuda.gridsize(1)):  # grid-stride
        i = idx % d
        h = (idx // d) % n_heads
        t = idx // (d * n_heads)
        out[idx] = x[off + t * st + h * sh + i]


@cuda.jit(cache=True)
def take_rows_cuda(x, x_off, x_ld, rows, n, out):  # noqa: ANN001
    """out (contiguous [L, n]) = x[rows]: the rows that need logits, gathered without a trip to the host."""
    for idx in range(cuda.grid(1), rows.shape[0] * n, cuda.gridsize(1)):  # grid-stride
        out[idx] = x[x_off + rows[idx // n] * x_ld + idx % n]


@cuda.jit(cache=True)
def moe_combine_cuda(y, y_off, y_ld, where, weights, k, n, out):  # noqa: ANN001
    """out (contiguous [T, n])[t] = sum over slots s in order of weights[t, s] * y[where[t, s]]: the
    mixture of experts' weighted sum (Backend.moe_combine). where, weights: [T * k] int32 / float32."""
    for idx in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):  # grid-stride
        t, i = idx // n, idx % n
        acc = weights[t * k] * y[y_off + where[t * k] * y_ld + i]
        for s in range(1, k):
            acc += weights[t * k + s] * y[y_off + where[t * k + s] * y_ld + i]
        out[idx] = acc
