"""Dequant-matmul over the tile16 weight layouts, for every CPU tier with tile primitives (tiers.py).

The layouts (tile_layouts.py) keep each GGUF type at its own bit width, rows interleaved 16 at a time;
the kernel's IR (vnni_ir.py) has one variant per compiled tier, layout and activation rows per block,
chosen by the `tier` argument (a CpuTier.index). Outputs are bit-identical to the portable kernels over
the int8 rows (matmul.py) on every tier. Only compiled when first called, and only with the IR of
tiers.compiled_tiers(), which the host can run: a CPU never sees another tier's instructions.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from edgellm.backends.cpu.fp16 import f16_bits_to_f32
from edgellm.backends.cpu.ir_util import switch_intrinsic
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.tiers import compiled_tiers
from edgellm.backends.cpu.tile_layouts import E8M0, F16, I8, LAYOUT_KEYS, TILE
from edgellm.backends.cpu.vnni_ir import N_ARGS, build_tile_kernel

RM = 4  # activation rows per register block (4 x (int, acc, macc) + the group's weight words fit 32 zmm)
# activation rows per block of the tile kernel's variants: a block of 2 for the 2 rows of a 2-request decode
# step (two passes of one row before) and the runs of 2 a batched MoE step gives many experts (a block of 4
# covering them before)
ROW_BLOCKS = (1, 2, RM)
TIER_VARIANTS = len(ROW_BLOCKS) * len(LAYOUT_KEYS)  # variants per tier


def variant_key(tier: int, layout_id: int, rm: int) -> int:
    return tier * TIER_VARIANTS + len(ROW_BLOCKS) * layout_id + (rm > 1) + (rm == RM)  # rm's index


# the same function for the kernels: the keys _tile_rows asks for are the keys the variants were built under
_variant_key = njit(nogil=True, inline="always")(variant_key)


# _tile(key, ...): one IR variant per (compiled tier, layout, activation rows per block)
_tile = switch_intrinsic(
    {
        variant_key(tier.index, i, rm): (
            f"edgellm_tile16_{tier.name}_l{i}_rm{rm}",
            lambda m, n, key=key, rm=rm, ops=tier.tiles: build_tile_kernel(m, n, key, rm, ops),
        )
        for tier in compiled_tiers()
        for i, key in enumerate(LAYOUT_KEYS)
        for rm in ROW_BLOCKS
    },
    N_ARGS,
)


@njit(cache=True, nogil=True, inline="always")
def plane_addresses(planes) -> np.ndarray:
    """int64 [6, 2]: each plane's (address, bytes per tile) (an absent plane's stride is 0)."""
    at = np.empty((6, 2), np.int64)
    lo, hi, d, sub, m_pl, msub = planes
    at[0, 0], at[0, 1] = lo.ctypes.data, lo.strides[0]
    at[1, 0], at[1, 1] = hi.ctypes.data, hi.strides[0]
    at[2, 0], at[2, 1] = d.ctypes.data, d.strides[0]
    at[3, 0], at[3, 1] = sub.ctypes.data, sub.strides[0]
    at[4, 0], at[4, 1] = m_pl.ctypes.data, m_pl.strides[0]
    at[5, 0], at[5, 1] = msub.ctypes.data, msub.strides[0]
    return at


@njit(cache=True, nogil=True)
def matmul_tiles_cpu(xq, xs, xsum, xisum, planes, layout_id, n_units, n_rows, n_threads, tier, out) -> None:
    """out[M, :n_rows] from tile16 weights. planes: the 6 planes (lo, hi, d, sub, m, msub) as uint8
    [T, bytes per tile] (an absent plane: [T, 0]). See matmul_tiles_at_cpu."""
    at, n_tiles = plane_addresses(planes), planes[0].shape[0]
    matmul_tiles_at_cpu(xq, xs, xsum, xisum, at, n_tiles, layout_id, n_units, n_rows, n_threads, tier, out)


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles_at_cpu(xq, xs, xsum, xisum, at, n_tiles, layout_id, n_units, n_rows, n_threads, tier, out):  # noqa: ANN201
    """matmul_tiles_cpu over planes given by plane_addresses (at: int64 [6, 2]) and their n_tiles tiles:
    a layer's weights reach the fused layer (layer.py) as one small array, not 72 to unbox per call; the
    caller keeps the planes alive. Each thread takes a contiguous run of tiles; per tile, the activation
    rows pass in blocks of RM (the tile's weights stay in L1), the rest as _tile_rows says. A partial
    last tile is computed into a scratch block and copied. xq/xs/xsum/xisum must be C-contiguous; out's
    rows must be contiguous (any row stride). tier: a compiled CpuTier's index (the caller checks;
    another writes nothing)."""
    n_blocks = min(n_tiles, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    for blk in prange(n_blocks):
        scratch = np.empty((RM, TILE), np.float32)
        for t in range(blk * n_tiles // n_blocks, (blk + 1) * n_tiles // n_blocks):
            _tile_rows(
                xq, xs, xsum, xisum, at, t, 0, xq.shape[0], layout_id, n_units, n_rows, tier, out, scratch
            )


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles_runs_at_cpu(  # noqa: ANN201
    xq, xs, xsum, xisum, run_at, run_bounds, n_tiles, layout_id, n_units, n_rows, n_threads, tier, out
):
    """Several weights of one layout and shape, each over its own run of activation rows, in one parallel
    region (the experts of a mixture-of-experts layer): out[a:b] = xq[a:b] @ W_r.T for run r, rows
    a, b = run_bounds[r], run_bounds[r + 1]; run_at: int64 [R, 6, 2], run r's plane addresses. The
    (run, tile) pairs are split into contiguous spans of about equal work (a pair's rows, plus a little for
    the pass over its weights), one per thread; each pair as matmul_tiles_at_cpu computes a tile, so
    every output has the bits of that kernel. The caller checks that every run's weights have this
    layout, n_tiles tiles, n_units units and n_rows rows, and that the bounds ascend within xq's rows."""
    n_runs = run_at.shape[0]
    n_items = n_runs * n_tiles
    n_blocks = min(n_items, n_threads)
    first = np.zeros(n_blocks + 1, np.int64)  # thread blk's pairs: first[blk] .. first[blk + 1] - 1
    first[n_blocks] = n_items
    total = 0
    for r in range(n_runs):
        total += (run_bounds[r + 1] - run_bounds[r] + 2) * n_tiles
    done, blk = 0, 1
    for r in range(n_runs):
        cost = run_bounds[r + 1] - run_bounds[r] + 2
        for t in range(n_tiles):
            while blk < n_blocks and done * n_blocks >= blk * total:
                first[blk] = r * n_tiles + t
                blk += 1
            done += cost
    while blk < n_blocks:
        first[blk] = n_items
        blk += 1
    for blk in prange(n_blocks):
        scratch = np.empty((RM, TILE), np.float32)
        for item in range(first[blk], first[blk + 1]):
            r, t = item // n_tiles, item % n_tiles
            _tile_rows(
                xq, xs, xsum, xisum, run_at[r], t, run_bounds[r], run_bounds[r + 1], layout_id, n_units,
                n_rows, tier, out, scratch,
            )  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _tile_rows(xq, xs, xsum, xisum, at, t, m0, m1, layout_id, n_units, n_rows, tier, out, scratch) -> None:
    """Tile t's 16 output columns of activation rows m0..m1 - 1: blocks of RM rows (the tile's weights stay
    in L1), then the last 2 as one block of 2, or the last 3 as one block of RM rows of xq that covers
    them (starting at them, or earlier where xq ends first; the other rows' results are dropped): one
    pass over the tile's weights instead of one a row, for the few rows each expert gets in a batched
    decode step. A last row goes alone. Blocks not written in place (a covering block, a partial last
    tile) go through `scratch` ([RM, TILE] f32). Every row's result has the same bits whichever block
    computes it."""
    out_stride = out.strides[0] // 4
    n0 = t * TILE
    lanes = min(TILE, n_rows - n0)
    n_x = xq.shape[0]
    m = m0
    while m < m1:
        left = m1 - m
        rm, take, base = 1, 1, m
        if left >= RM:
            rm, take = RM, RM
        elif left == 2:
            rm, take = 2, 2
        elif left >= 2 and n_x >= RM:
            rm, take, base = RM, left, min(m, n_x - RM)
        direct = lanes == TILE and base == m and take == rm
        dst = out.ctypes.data + (m * out.strides[0] + n0 * 4) if direct else scratch.ctypes.data
        _tile(
            _variant_key(tier, layout_id, rm),
            at[0, 0] + t * at[0, 1], at[1, 0] + t * at[1, 1], at[2, 0] + t * at[2, 1],
            at[3, 0] + t * at[3, 1], at[4, 0] + t * at[4, 1], at[5, 0] + t * at[5, 1],
            n_units,
            xq.ctypes.data + base * xq.strides[0], xq.strides[0],
            xs.ctypes.data + base * xs.strides[0],
            xsum.ctypes.data + base * xsum.strides[0],
            xisum.ctypes.data + base * xisum.strides[0],
            xs.shape[1], dst, out_stride if direct else TILE,
        )  # fmt: skip
        if not direct:
            for i in range(take):
                for lane in range(lanes):
                    out[m + i, n0 + lane] = scratch[m - base + i, lane]
        m += take


# their machine code includes other files' IR
follow_sources(matmul_tiles_cpu, matmul_tiles_at_cpu, matmul_tiles_runs_at_cpu)


@njit(cache=True, nogil=True, inline="always")
def _plane_byte(plane, t, lane, o):
    """Byte o of row (t, lane) in a tiled byte plane (words of 4 bytes, 16 lanes per word)."""
    return plane[t, (o >> 2) * 64 + lane * 4 + (o & 3)]


@njit(cache=True, nogil=True, inline="always")
def _scale(plane, t, lane, index, kind):
    """Element `index` of row (t, lane) of a [.., 16] d/m plane as f32 (f16 bits or f32)."""
    if kind == F16:
        return f16_bits_to_f32(plane[t].view(np.uint16)[index * TILE + lane])
    if kind == E8M0:  # gguf's e8m0_to_fp32_half: exactly 2^(e - 128) (e < 2 are f32 subnormals)
        return np.float32(math.ldexp(1.0, np.int64(plane[t, index * TILE + lane]) - 128))
    return plane[t].view(np.float32)[index * TILE + lane]


@njit(cache=True, nogil=True, parallel=True)
def gather_tiles_cpu(planes, lay, ids, out) -> None:
    """Embedding lookup from the tile16 layout: out[i] = dequantized row ids[i], with the float ops of the
    kernels (scale = f32(d) * f32(sub), + min), so the same bits as gguf's dequantize. lay: the layout's
    key as an int64 array (TileLayout.key, table entries included)."""
    lo, hi, d, sub, m_pl, msub = planes
    split, hi_bits, hi_stride, offset, group, unit = lay[0], lay[1], lay[2], lay[3], lay[4], lay[5]
    d_cols, d_kind, sub_kind, m_kind, m_neg_sub = lay[6], lay[7], lay[8], lay[9], lay[10]
    has_lut = lay.shape[0] > 11  # a table type: lay[11 + nibble] is the stored value
    k_cols = out.shape[1]
    for i in prange(ids.shape[0]):
        t, lane = ids[i] // TILE, ids[i] % TILE
        for k in range(k_cols):
            un, c = k // unit, k % unit
            if split:
                run, within = c // (2 * split), c % (2 * split)
                high = within >= split
                byte = _plane_byte(lo, t, lane, un * (unit // 2) + run * split + within - split * high)
                v = np.int32((byte >> 4) if high else (byte & 15))
                if has_lut:
                    v = np.int32(lay[11 + v])
            else:
                v = np.int32(_plane_byte(lo, t, lane, k))
            if hi_bits:
                field, o = c // hi_stride, c % hi_stride
                hbyte = np.int32(_plane_byte(hi, t, lane, un * (unit * hi_bits // 8) + o))
                v |= ((hbyte >> (hi_bits * field)) & ((1 << hi_bits) - 1)) << 4
            g = k // group
            s = _scale(d, t, lane, k // d_cols, d_kind)
            if sub_kind:
                sb = sub[t, g * TILE + lane]
                s = s * np.float32(np.int8(sb) if sub_kind == I8 else sb)
            val = s * np.float32(v - offset)
            if m_kind:
                mn = _scale(m_pl, t, lane, k // d_cols, m_kind)
                if m_neg_sub:
                    mn = -(mn * np.float32(msub[t, g * TILE + lane]))
                val = val + mn
            out[i, k] = val
