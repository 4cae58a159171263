"""Fused dequant-matmul CPU kernels (Numba) over the repacked "int8 grouped" weights.

y[m, n] = sum_g (xs[m,g] * scale[n,g]) * isum[m,n,g] + sum_g minv[n,g] * xsum[m,g], where isum is the exact
int32 dot of the int8 activation group with the int8 weight group and xsum the float sum of the activation
group. Activations are quantized per group (symmetric, d = amax/127, like llama.cpp's q8_0).

Batch invariance: a row's result must not depend on M or on its batch neighbours. The integer sums are
exact whatever order LLVM picks; the float accumulation over groups runs in group order in every path,
and these kernels use a fast-math set WITHOUT 'reassoc' and 'contract' so LLVM can neither reorder that
sum nor fuse it into FMAs differently in the GEMV and GEMM loops (the float part is ~1/G of the work).
Indices are unsigned so Numba emits no wraparound checks, which otherwise block vectorisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import njit, prange

from edgellm.backends.cpu import vnni
from edgellm.backends.cpu.fp16 import f16_round
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.tiers import TIERS, CpuTierError, active_tier, compiled_tiers
from edgellm.backends.cpu.tile_layouts import TILE_LAYOUTS
from edgellm.quants.packing import ACT_MODES, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from edgellm.quants.packing import PackedWeight

ORDERED_MATH = {"nsz", "arcp", "afn"}  # no reassoc/contract: per-(m,n) float order fixed (see docstring)
U = np.uint64


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _quantize_act_row(xr, xb, qr, m, group, mode, xs, xsum, xisum) -> None:
    """Row m of quantize_act_cpu (shared by the parallel and the serial entry: same code, same bits).
    xr/xb/qr: the row as f32 / its uint32 bits / int8 out (1-D views). Written so LLVM vectorises it
    (3.5x faster than 2-D indexing with a branchy max): unsigned 1-D indices, and the largest magnitude
    as an integer max over the bits with the sign cleared (monotonic for floats; a float max reduction
    needs fast-math flags these kernels avoid), its first position giving the signed value q8_K needs."""
    block = 256 if mode == ACT_Q8_K else 32
    n_blocks = xr.shape[0] // block
    per_block = block // group
    for b in range(n_blocks):
        base = U(b * block)
        top = np.uint32(0)
        for k in range(U(0), U(block)):
            top = max(top, xb[base + k] & np.uint32(0x7FFFFFFF))
        vmax = np.float32(0.0)
        for k in range(U(0), U(block)):  # the first value of that magnitude, as a strict `>` scan finds
            if xb[base + k] & np.uint32(0x7FFFFFFF) == top:
                vmax = xr[base + k]
                break
        amax = abs(vmax)
        if mode == ACT_Q8_K:
            iscale = np.float32(-127.0) / vmax if amax > 0 else np.float32(0.0)
            d = np.float32(1.0) / iscale if amax > 0 else np.float32(0.0)
            d_stored = d
        else:
            iscale = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            d = amax / np.float32(127.0)
            d_stored = f16_round(d)
        for k in range(U(0), U(block)):
            qv = np.rint(xr[base + k] * iscale)  # ties to even, as llama.cpp's SIMD/nearest_int
            qr[base + k] = np.int8(min(qv, np.float32(127.0)))
        for j in range(per_block):
            g = b * per_block + j
            gb = base + U(j * group)
            isum = np.int32(0)
            for k in range(U(0), U(group)):
                isum += np.int32(qr[gb + k])
            xs[m, g] = d_stored
            xisum[m, g] = isum
            if mode == ACT_Q8_1:
                xsum[m, g] = f16_round(d * np.float32(isum))
            else:
                xsum[m, g] = d_stored * np.float32(isum)


@njit(cache=True, nogil=True, inline="always")
def _act_buffers(x: np.ndarray, group: int) -> tuple[np.ndarray, ...]:
    """quantize_act_cpu's outputs: xq int8 [M, K], xs / xsum f32 and xisum int32 [M, K // G]."""
    m_rows, k_cols = x.shape
    n_groups = k_cols // group
    return (
        np.empty((m_rows, k_cols), np.int8),
        np.empty((m_rows, n_groups), np.float32),
        np.empty((m_rows, n_groups), np.float32),
        np.empty((m_rows, n_groups), np.int32),
    )


@njit(cache=True, nogil=True, parallel=True, fastmath=ORDERED_MATH)
def quantize_act_cpu(x: np.ndarray, group: int, mode: int) -> tuple[np.ndarray, ...]:
    """x f32 [M,K] -> (xq int8 [M,K], xs f32 [M,K//G], xsum f32 [M,K//G], xisum int32 [M,K//G]) for
    weight group G.

    Quantizes exactly as llama.cpp quantizes activations for the weight type (see ACT_*), then expresses
    the result per weight group: xs[m, g] is the scale of the activation block holding group g, and
    xsum[m, g] = xs * sum(xq over the group) (f16-rounded for q8_1, as its `s` field) — the sum of the
    dequantized activations, so the min term sees the same rounding as the integer term. xisum is the
    exact integer sum of xq over the group (the VNNI kernels' offset correction)."""
    xq, xs, xsum, xisum = _act_buffers(x, group)
    xbits = x.view(np.uint32)
    for m in prange(x.shape[0]):
        _quantize_act_row(x[m], xbits[m], xq[m], m, group, mode, xs, xsum, xisum)
    return xq, xs, xsum, xisum


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def quantize_act_serial_cpu(x: np.ndarray, group: int, mode: int) -> tuple[np.ndarray, ...]:
    """quantize_act_cpu without a parallel region: one row (decode) costs ~1 us, less than waking a thread."""
    xq, xs, xsum, xisum = _act_buffers(x, group)
    xbits = x.view(np.uint32)
    for m in range(x.shape[0]):
        _quantize_act_row(x[m], xbits[m], xq[m], m, group, mode, xs, xsum, xisum)
    return xq, xs, xsum, xisum


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def quantize_act_rows_cpu(x: np.ndarray, group: int, mode: int) -> tuple[np.ndarray, ...]:
    """quantize_act_cpu's result, serially for a few rows (a parallel region costs more than ~1 us of
    work), in parallel past 16: the same bits either way (one row function)."""
    if x.shape[0] <= 16:
        return quantize_act_serial_cpu(x, group, mode)
    return quantize_act_cpu(x, group, mode)


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def matmul_tiles_fused_cpu(x, planes, layout_id, group, mode, n_units, n_rows, n_threads, tier, out) -> None:
    """Quantize + tiles in one call from Python (no boxing of the quantized activations)."""
    at, n_tiles = vnni.plane_addresses(planes), planes[0].shape[0]
    matmul_tiles_fused_at_cpu(x, at, n_tiles, layout_id, group, mode, n_units, n_rows, n_threads, tier, out)


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def matmul_tiles_fused_at_cpu(x, at, n_tiles, layout_id, group, mode, n_units, n_rows, n_threads, tier, out):  # noqa: ANN201
    """matmul_tiles_fused_cpu over planes given by vnni.plane_addresses."""
    xq, xs, xsum, xisum = quantize_act_rows_cpu(x, group, mode)
    vnni.matmul_tiles_at_cpu(
        xq, xs, xsum, xisum, at, n_tiles, layout_id, n_units, n_rows, n_threads, tier, out
    )


follow_sources(matmul_tiles_fused_cpu, matmul_tiles_fused_at_cpu)  # their code includes other files' IR


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _group_dot(xrow: np.ndarray, wrow: np.ndarray, base: np.uint64, g_u: np.uint64) -> np.int32:
    acc = np.int32(0)
    for k in range(U(0), g_u):
        acc += np.int32(xrow[base + k]) * np.int32(wrow[base + k])
    return acc


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _row_dot(xrow, xs_row, xsum_row, wrow, sc_row, mn_row, n_groups, g_u, has_min) -> np.float32:
    """One output: the reference order every path reproduces exactly (see module docstring)."""
    acc = np.float32(0.0)
    macc = np.float32(0.0)
    for g in range(n_groups):
        isum = _group_dot(xrow, wrow, U(g) * g_u, g_u)
        acc += (xs_row[g] * sc_row[g]) * np.float32(isum)
        if has_min:
            macc += mn_row[g] * xsum_row[g]
    return acc + macc


@njit(cache=True, nogil=True, parallel=True, fastmath=ORDERED_MATH)
def gemv_grouped_cpu(xq, xs, xsum, q, scale, minv, has_min, group, out) -> None:
    """Decode path (one activation row): parallel over weight rows, streams q once."""
    n_rows, k_cols = q.shape
    n_groups = k_cols // group
    g_u = U(group)
    x0 = xq[0]
    xs0 = xs[0]
    xsum0 = xsum[0]
    for n in prange(n_rows):
        mn_row = minv[n] if has_min else scale[n]
        out[0, n] = _row_dot(x0, xs0, xsum0, q[n], scale[n], mn_row, n_groups, g_u, has_min)


@njit(cache=True, nogil=True, parallel=True, fastmath=ORDERED_MATH)
def gemm_grouped_cpu(xq, xs, xsum, q, scale, minv, has_min, group, out) -> None:
    """Prefill/batched path: 4 activation rows x 2 weight rows per register tile; weight rows stay in L1
    while every activation row passes over them. Leftover rows use _row_dot (same arithmetic)."""
    m_rows = xq.shape[0]
    n_rows, k_cols = q.shape
    n_groups = k_cols // group
    g_u = U(group)
    n_pairs = (n_rows + 1) // 2
    for p in prange(n_pairs):
        n = 2 * p
        if n + 1 == n_rows:  # odd tail row
            mn_row = minv[n] if has_min else scale[n]
            for m in range(m_rows):
                out[m, n] = _row_dot(xq[m], xs[m], xsum[m], q[n], scale[n], mn_row, n_groups, g_u, has_min)
            continue
        wa = q[n]
        wb = q[n + 1]
        sa = scale[n]
        sb = scale[n + 1]
        ma = minv[n] if has_min else sa
        mb = minv[n + 1] if has_min else sb
        m = 0
        while m + 4 <= m_rows:
            x0 = xq[m]
            x1 = xq[m + 1]
            x2 = xq[m + 2]
            x3 = xq[m + 3]
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
            ma0 = ma1 = ma2 = ma3 = mb0 = mb1 = mb2 = mb3 = np.float32(0.0)
            for g in range(n_groups):
                base = U(g) * g_u
                s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = np.int32(0)
                for kk in range(U(0), g_u):
                    k = base + kk
                    wa_k = np.int32(wa[k])
                    wb_k = np.int32(wb[k])
                    y0 = np.int32(x0[k])
                    y1 = np.int32(x1[k])
                    y2 = np.int32(x2[k])
                    y3 = np.int32(x3[k])
                    s0 += y0 * wa_k
                    s1 += y1 * wa_k
                    s2 += y2 * wa_k
                    s3 += y3 * wa_k
                    t0 += y0 * wb_k
                    t1 += y1 * wb_k
                    t2 += y2 * wb_k
                    t3 += y3 * wb_k
                a0 += (xs[m, g] * sa[g]) * np.float32(s0)
                a1 += (xs[m + 1, g] * sa[g]) * np.float32(s1)
                a2 += (xs[m + 2, g] * sa[g]) * np.float32(s2)
                a3 += (xs[m + 3, g] * sa[g]) * np.float32(s3)
                b0 += (xs[m, g] * sb[g]) * np.float32(t0)
                b1 += (xs[m + 1, g] * sb[g]) * np.float32(t1)
                b2 += (xs[m + 2, g] * sb[g]) * np.float32(t2)
                b3 += (xs[m + 3, g] * sb[g]) * np.float32(t3)
                if has_min:
                    ma0 += ma[g] * xsum[m, g]
                    ma1 += ma[g] * xsum[m + 1, g]
                    ma2 += ma[g] * xsum[m + 2, g]
                    ma3 += ma[g] * xsum[m + 3, g]
                    mb0 += mb[g] * xsum[m, g]
                    mb1 += mb[g] * xsum[m + 1, g]
                    mb2 += mb[g] * xsum[m + 2, g]
                    mb3 += mb[g] * xsum[m + 3, g]
            out[m, n] = a0 + ma0
            out[m + 1, n] = a1 + ma1
            out[m + 2, n] = a2 + ma2
            out[m + 3, n] = a3 + ma3
            out[m, n + 1] = b0 + mb0
            out[m + 1, n + 1] = b1 + mb1
            out[m + 2, n + 1] = b2 + mb2
            out[m + 3, n + 1] = b3 + mb3
            m += 4
        while m < m_rows:
            out[m, n] = _row_dot(xq[m], xs[m], xsum[m], wa, sa, ma, n_groups, g_u, has_min)
            out[m, n + 1] = _row_dot(xq[m], xs[m], xsum[m], wb, sb, mb, n_groups, g_u, has_min)
            m += 1


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def matmul_dense_f32_cpu(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out = x @ w.T for float weights. One compiled loop serves every M, so a row's dot product is the
    same machine code whatever the batch (batch invariance) even with reassociation allowed."""
    m_rows, k_cols = x.shape
    n_rows = w.shape[0]
    for n in prange(n_rows):
        wrow = w[n]
        for m in range(m_rows):
            acc = np.float32(0.0)
            for k in range(U(0), U(k_cols)):
                acc += x[m, k] * wrow[k]
            out[m, n] = acc


def _check(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    if x.dtype != np.float32 or x.ndim != 2 or not x.flags.c_contiguous:
        raise ValueError(f"x must be C-contiguous float32 [M, K], got {x.dtype} {x.shape}")
    if x.shape[1] != w.cols or out.shape != (x.shape[0], w.rows) or out.dtype != np.float32:
        raise ValueError(
            f"shape mismatch: x {x.shape}, weight {w.rows}x{w.cols}, out {out.dtype} {out.shape}"
        )


def tile_tier_index(tier: int | None) -> int:
    """The tier index to run tile kernels with: `tier` if its IR is compiled, by default the active tier
    (or, where that has no tiles, the first compiled one); CpuTierError where none is."""
    compiled = compiled_tiers()
    if tier is None and compiled:
        return (active_tier() if active_tier() in compiled else compiled[0]).index
    if tier is None or TIERS[tier] not in compiled:
        asked = "none" if tier is None else TIERS[tier].name
        names = ", ".join(t.name for t in compiled) or "none"
        raise CpuTierError(f"tiled weights need a compiled tile tier (asked: {asked}; compiled: {names})")
    return tier


def matmul_grouped_cpu(
    x: np.ndarray, w: PackedWeight, out: np.ndarray, n_threads: int | None = None, tier: int | None = None
) -> None:
    """out[M, N] = x[M, K] @ W.T for quantized weights (writes in place; out may be a strided view).
    n_threads: how many runs of tiles to split the work into (default: Numba's thread count; the backend
    passes it in, as asking Numba costs ~1.5 us a call, ~0.2 ms of a small model's decode step).
    tier: the CpuTier.index tiled weights run with (tile_tier_index)."""
    _check(x, w, out)
    if w.tiles is not None:
        if out.strides[1] != 4:  # the tiles store 16 contiguous floats per row
            tmp = np.empty(out.shape, np.float32)
            matmul_grouped_cpu(x, w, tmp, n_threads, tier)
            out[...] = tmp
            return
        t = w.tiles
        n_units = w.cols // TILE_LAYOUTS[w.qtype].unit
        n_threads = n_threads or numba.get_num_threads()
        tier = tile_tier_index(tier)
        matmul_tiles_fused_cpu(
            x, t.planes, t.layout_id, w.group, w.act_mode, n_units, w.rows, n_threads, tier, out
        )
        return
    has_min = w.minv is not None
    minv = w.minv if has_min else w.scale  # placeholder of the right type; unused when has_min is False
    xq, xs, xsum, _ = quantize_act_cpu(x, w.group, w.act_mode)
    kernel = gemv_grouped_cpu if x.shape[0] == 1 else gemm_grouped_cpu
    kernel(xq, xs, xsum, w.q, w.scale, minv, has_min, w.group, out)


def matmul_dense_cpu(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    """out[M, N] = x[M, K] @ W.T for float weights held as dense f32."""
    _check(x, w, out)
    if w.act_round is not None:  # llama.cpp converts activations to the weight's float type first
        x = w.act_round(x)
    matmul_dense_f32_cpu(x, w.dense, out)


def matmul_cpu(
    x: np.ndarray, w: PackedWeight, out: np.ndarray, n_threads: int | None = None, tier: int | None = None
) -> None:
    """Entry point: out[M, N] = x[M, K] @ W.T, written in place, results independent of M per row."""
    if w.dense is not None:
        matmul_dense_cpu(x, w, out)
    else:
        matmul_grouped_cpu(x, w, out, n_threads, tier)
