"""Dequant-matmul CUDA kernels over quantized weights kept quantized in device memory.

Weights are uploaded once in the CPU backend's "int8 grouped" form (packed.py): q int8 [N, K] (stored as
int32 words of 4 weights), scale f32 [N, K//G], optional min f32 [N, K//G]; never a float copy. Float
weights stay dense (F16 as float16, F32/BF16 as float32). Activations are quantized on the device exactly as
llama.cpp's vec_dot_type (quantize_act_ref), so a dot product is an exact int32 sum per group, scaled:

    out[m, n] = sum_g (xs[m,g] * scale[n,g]) * isum[m,n,g] + min[n,g] * xsum[m,g]

One kernel serves decode (tile 1 in M: a GEMV) and prefill / batched decode (a tile of GEMM_TILE_M
activation rows per thread, each weight word loaded once per tile). A team of MATMUL_LANES threads shares an
output row, each lane summing every LANES-th group in order, then a fixed shared-memory tree: a row's result
therefore never depends on M or on its batch neighbours (batch invariance), as on the CPU. Products go
through `mul_rn` so NVVM cannot fuse them into FMAs that would round differently from the CPU kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from edgellm.backends.cuda.act_quant import QUANT_TEAMS, act_block, quantize_act_cuda
from edgellm.backends.cuda.config import (
    GEMM_TILE_M,
    MATMUL_LANES,
    MATMUL_ROWS,
    ROW_THREADS,
    SIMULATOR,
    cdiv,
    f16_round,
    launch,
    mul_rn,
)
from edgellm.backends.cuda.vecload import load4
from edgellm.quants.packing import PackedWeight
from edgellm.quants.traits import get_traits

ACT_ROUND = {"f32": 0, "f16": 1, "bf16": 2}  # activation rounding before a float-weight dot (llama.cpp)
BF16_SPLIT = np.float32(65537.0)  # Veltkamp split constant 2^16 + 1: keeps the top 8 significand bits


@dataclass
class DeviceWeight:
    rows: int  # N
    cols: int  # K
    qtype: Any
    q: Any = None  # int32 [N, K // 4] device: 4 int8 weights per word
    scale: Any = None  # f32 [N, K // group]
    minv: Any = None  # f32 [N, K // group] or None
    dense: Any = None  # f32 / f16 [N, K] for float types
    group: int = 0
    act_mode: int = 0
    act_round: int = 0
    nbytes: int = 0


def upload_weight(p: PackedWeight) -> DeviceWeight:
    """One host->device copy of a repacked weight; quantized blocks stay quantized."""
    traits = get_traits(p.qtype)
    if p.dense is not None:
        dense = p.dense.astype(np.float16) if traits.vec_dot == "f16" else p.dense  # F16: exact round trip
        d = cuda.to_device(np.ascontiguousarray(dense))
        return DeviceWeight(
            p.rows, p.cols, p.qtype, dense=d, act_round=ACT_ROUND[traits.vec_dot], nbytes=dense.nbytes
        )
    words = np.ascontiguousarray(p.q).view(np.int32)
    if words.shape[1] % 4 or p.group % 16:
        raise ValueError(
            f"{p.qtype.name} weight {p.rows}x{p.cols}: the CUDA matmul loads 16 bytes at a time and needs "
            f"groups of a multiple of 16 weights, got group {p.group}"
        )
    w = DeviceWeight(
        p.rows,
        p.cols,
        p.qtype,
        q=cuda.to_device(words),
        scale=cuda.to_device(p.scale),
        group=p.group,
        act_mode=p.act_mode,
        nbytes=words.nbytes + p.scale.nbytes,
    )
    check_vec4(w.q, f"{p.qtype.name} weight {p.rows}x{p.cols}")
    if p.minv is not None:
        w.minv = cuda.to_device(p.minv)
        w.nbytes += p.minv.nbytes
    return w


@cuda.jit(device=True, inline=True)
def byte_of(word, i):  # noqa: ANN001, ANN201
    """Signed byte i (0 = lowest) of an int32 word."""
    return np.int32(word << (24 - 8 * i)) >> 24


@cuda.jit(device=True, inline=True)
def bf16_round(x):  # noqa: ANN001, ANN201
    """x rounded to bfloat16's 8 significand bits (Veltkamp split; ties may round either way)."""
    t = mul_rn(x, BF16_SPLIT)
    return t - (t - x)


@cuda.jit(device=True)
def _reduce_team_and_store(red, acc, ty, lane, n, n_rows, m0, m_rows, out, out_off, out_ld):  # noqa: ANN001
    """Sum each thread's partial dots (acc[i] for activation rows m0+i of output row n) across the team's
    lanes in a fixed tree order (batch-invariant), then lane 0 writes the row. red: the kernel's shared
    [rows, lanes, tile_m] scratch."""
    tile_m = red.shape[2]
    for i in range(tile_m):
        red[ty, lane, i] = acc[i]
    cuda.syncthreads()
    s = red.shape[1] // 2
    while s > 0:
        if lane < s:
            for i in range(tile_m):
                red[ty, lane, i] += red[ty, lane + s, i]
        cuda.syncthreads()
        s //= 2
    if lane == 0 and n < n_rows:
        for i in range(tile_m):
            if m0 + i < m_rows:
                out[out_off + (m0 + i) * out_ld + n] = red[ty, 0, i]


def _grouped_kernel(tile_m: int):  # noqa: ANN202
    lanes, rows = MATMUL_LANES, MATMUL_ROWS

    @cuda.jit(cache=True)
    def matmul_grouped_cuda(xq, xs, xsum, q, scale, minv, has_min, m_rows, out, out_off, out_ld):  # noqa: ANN001
        lane = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        n = cuda.blockIdx.x * rows + ty
        m0 = cuda.blockIdx.y * tile_m
        n_groups = scale.shape[1]
        gw = q.shape[1] // n_groups  # words per group
        acc = cuda.local.array(tile_m, np.float32)
        macc = cuda.local.array(tile_m, np.float32)
        isum = cuda.local.array(tile_m, np.int32)
        wb = cuda.local.array(16, np.int32)  # the 16 signed weights of one load
        for i in range(tile_m):
            acc[i] = 0.0
            macc[i] = 0.0
        if n < q.shape[0]:
            for g in range(lane, n_groups, lanes):
                for i in range(tile_m):
                    isum[i] = 0
                for j in range(g * gw, (g + 1) * gw, 4):  # 16 weights per 16-byte load (check_vec4)
                    w4 = load4(q, n, j)
                    for c in range(4):
                        wv = w4[c]
                        wb[4 * c] = byte_of(wv, 0)
                        wb[4 * c + 1] = byte_of(wv, 1)
                        wb[4 * c + 2] = byte_of(wv, 2)
                        wb[4 * c + 3] = byte_of(wv, 3)
                    for i in range(tile_m):
                        if m0 + i < m_rows:
                            x4 = load4(xq, m0 + i, j)
                            for c in range(4):
                                xv = x4[c]
                                isum[i] += (
                                    wb[4 * c] * byte_of(xv, 0)
                                    + wb[4 * c + 1] * byte_of(xv, 1)
                                    + wb[4 * c + 2] * byte_of(xv, 2)
                                    + wb[4 * c + 3] * byte_of(xv, 3)
                                )
                sc = scale[n, g]
                for i in range(tile_m):
                    m = m0 + i
                    if m < m_rows:
                        acc[i] += mul_rn(mul_rn(xs[m, g], sc), np.float32(isum[i]))
                        if has_min:
                            macc[i] += mul_rn(minv[n, g], xsum[m, g])
        for i in range(tile_m):
            acc[i] += macc[i]
        red = cuda.shared.array((rows, lanes, tile_m), np.float32)
        _reduce_team_and_store(red, acc, ty, lane, n, q.shape[0], m0, m_rows, out, out_off, out_ld)

    return matmul_grouped_cuda


def _dense_kernel(tile_m: int):  # noqa: ANN202
    lanes, rows = MATMUL_LANES, MATMUL_ROWS

    @cuda.jit(cache=True)
    def matmul_dense_cuda(x, x_off, x_ld, w, act_round, m_rows, out, out_off, out_ld):  # noqa: ANN001
        lane = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        n = cuda.blockIdx.x * rows + ty
        m0 = cuda.blockIdx.y * tile_m
        acc = cuda.local.array(tile_m, np.float32)
        for i in range(tile_m):
            acc[i] = 0.0
        if n < w.shape[0]:
            for k in range(lane, w.shape[1], lanes):
                wk = np.float32(w[n, k])
                for i in range(tile_m):
                    if m0 + i < m_rows:
                        xv = x[x_off + (m0 + i) * x_ld + k]
                        if act_round == 1:
                            xv = f16_round(xv)
                        elif act_round == 2:
                            xv = bf16_round(xv)
                        acc[i] += mul_rn(xv, wk)
        red = cuda.shared.array((rows, lanes, tile_m), np.float32)
        _reduce_team_and_store(red, acc, ty, lane, n, w.shape[0], m0, m_rows, out, out_off, out_ld)

    return matmul_dense_cuda


GROUPED = {1: _grouped_kernel(1), GEMM_TILE_M: _grouped_kernel(GEMM_TILE_M)}
DENSE = {1: _dense_kernel(1), GEMM_TILE_M: _dense_kernel(GEMM_TILE_M)}


class Scratch:
    """Reused device scratch arrays (quantized activations), keyed by shape and dtype."""

    def __init__(self) -> None:
        self.arrays: dict[tuple, Any] = {}
        self.flat: dict[str, Any] = {}

    def at_least(self, name: str, n: int, dtype: Any, zeroed: bool = False) -> Any:
        """A flat array of at least n elements that only grows (doubling), so a step's shape changes do
        not pile up arrays; zeroed: filled with zeros whenever it is (re)allocated."""
        a = self.flat.get(name)
        if a is None or a.shape[0] < n:
            size = max(n, 2 * (a.shape[0] if a is not None else 0), 1)
            a = cuda.to_device(np.zeros(size, dtype)) if zeroed else cuda.device_array(size, dtype)
            self.flat[name] = a
        return a

    def get(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        key = (name, shape, np.dtype(dtype).str)
        a = self.arrays.get(key)
        if a is None:
            a = self.arrays[key] = cuda.device_array(shape, dtype)
        return a


def act_scratch(scratch: Scratch, m_rows: int, k_cols: int, group: int) -> tuple[Any, Any, Any]:
    """The quantized-activation arrays (xq, xs, xsum) for an [m_rows, k_cols] input."""
    n_groups = k_cols // group
    xq = scratch.get("xq", (m_rows, k_cols // 4), np.int32)
    xs = scratch.get("xs", (m_rows, n_groups), np.float32)
    xsum = scratch.get("xsum", (m_rows, n_groups), np.float32)
    return xq, xs, xsum


def quantize_act(x: Any, w: DeviceWeight, scratch: Scratch) -> tuple[Any, Any, Any]:
    """Device quantization of activations x (DeviceTensor [M, K]) for weight w's vec_dot type."""
    buf, off, ld = x.rows2d()
    m_rows, k_cols = x.shape
    xq, xs, xsum = act_scratch(scratch, m_rows, k_cols, w.group)
    grid = (m_rows, max(1, cdiv(k_cols // act_block(w.act_mode), QUANT_TEAMS)))  # a team per activation block
    launch(quantize_act_cuda, grid, ROW_THREADS, buf, off, ld, k_cols, w.group, w.act_mode, xq, xs, xsum)
    return xq, xs, xsum


def check_vec4(a: Any, what: str) -> None:
    """load4's preconditions (vecload.py) for a [rows, words] int32 device array."""
    if a.dtype != np.int32 or a.ndim != 2 or a.shape[1] % 4 or a.strides != (4 * a.shape[1], 4):
        raise ValueError(f"{what}: 16-byte loads need a C-contiguous int32 [rows, 4k] array, got {a.dtype} "
                         f"{a.shape} strides {a.strides}")  # fmt: skip
    if not SIMULATOR and (a.device_ctypes_pointer.value or 0) % 16:  # pragma: no cover - a GPU's address
        raise ValueError(f"{what}: the device address is not 16-byte aligned")


def matmul_cuda(x: Any, w: DeviceWeight, out: Any, scratch: Scratch, xquant: tuple | None = None) -> None:
    """out[M, N] = x[M, K] @ W.T on the device; out may be a column-slice view of a wider buffer.
    xquant: x already quantized for w's (group, act_mode) by the kernel that produced it (fused.py)."""
    m_rows, k_cols = x.shape
    if k_cols != w.cols or tuple(out.shape) != (m_rows, w.rows):
        raise ValueError(f"shape mismatch: x {x.shape}, weight {w.rows}x{w.cols}, out {out.shape}")
    if m_rows == 0:
        return
    o_buf, o_off, o_ld = out.rows2d()
    tile = 1 if m_rows == 1 else GEMM_TILE_M
    grid = (cdiv(w.rows, MATMUL_ROWS), cdiv(m_rows, tile))
    block = (MATMUL_LANES, MATMUL_ROWS)
    if w.dense is not None:
        x_buf, x_off, x_ld = x.rows2d()
        launch(DENSE[tile], grid, block, x_buf, x_off, x_ld, w.dense, w.act_round, m_rows, o_buf, o_off, o_ld)
        return
    xq, xs, xsum = xquant if xquant is not None else quantize_act(x, w, scratch)
    if tuple(xq.shape) != (m_rows, w.q.shape[1]):  # whole fresh scratch arrays (act_scratch): aligned
        raise ValueError(f"quantized activations {xq.shape}: expected {m_rows} rows of {w.q.shape[1]} words")
    has_min = w.minv is not None
    minv = w.minv if has_min else w.scale
    launch(GROUPED[tile], grid, block, xq, xs, xsum, w.q, w.scale, minv, has_min, m_rows, o_buf, o_off, o_ld)


@cuda.jit(cache=True)
def gather_rows_cuda(q, scale, minv, has_min, group, dense, is_dense, ids, emb_scale, out):  # noqa: ANN001
    """Embedding lookup: out[i, k] = W[ids[i], k] (same float ops as gguf's dequantize), times emb_scale."""
    k_cols = out.shape[1]
    for idx in range(cuda.grid(1), out.shape[0] * k_cols, cuda.gridsize(1)):  # grid-stride
        i = idx // k_cols
        k = idx % k_cols
        r = ids[i]
        if is_dense:
            v = np.float32(dense[r, k])
        else:
            v = scale[r, k // group] * np.float32(byte_of(q[r, k // 4], k % 4))
            if has_min:
                v = v + minv[r, k // group]
        if emb_scale != 1.0:
            v = v * emb_scale
        out[i, k] = v
