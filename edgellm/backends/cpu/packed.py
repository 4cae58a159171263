"""Weights repacked once at load time into the form the CPU kernels stream.

On hosts with AVX-512 VNNI quantized weights go straight from the GGUF's blocks to vnni's tile16 layouts
at the file's own bit width (`pack_tiles`; tile_layouts.py describes them). Elsewhere they become "int8
grouped" rows for the portable kernels (`pack_weight`, shared host code the CUDA backend uploads too):
q int8 [N, K], scale f32 [N, K//G], minv f32 [N, K//G] or None. Float types (F32/F16/BF16) become a
dense f32 [N, K] matrix on every host.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from edgellm.backends.cpu import vnni
from edgellm.backends.cpu.matmul import ORDERED_MATH, U
from edgellm.backends.cpu.tile_layouts import E8M0, F16, F32, LAYOUT_KEYS, TILE, TILE_LAYOUTS, TileLayout
from edgellm.backends.cpu.weight_memory import weight_array
from edgellm.gguf.reader import release_mapped_pages
from edgellm.quants.packing import ACT_MODES, PackedWeight, Tiles, pack_weight
from edgellm.quants.traits import get_traits

__all__ = ["dequantize_rows_cpu", "pack_tiles", "pack_weight", "pack_weight_tiled"]

SCALE_BYTES = {F16: 2, F32: 4, E8M0: 1}  # bytes of one d of each kind
TILED_CHUNK_ROWS = 1024  # rows repacked at a time (a multiple of TILE): bounds the temporaries


def _plane_widths(lay: TileLayout, cols: int) -> list[int]:
    """Bytes per tile of each plane (lo, hi, d, sub, m, msub); 0 for a plane the layout has not."""
    n_d, n_g = cols // lay.d_cols, cols // lay.group
    scale_bytes = SCALE_BYTES[lay.d_kind]
    return [
        TILE * lay.lo_bytes(cols),
        TILE * lay.hi_bytes(cols),
        TILE * n_d * scale_bytes,
        TILE * n_g if lay.sub_kind else 0,
        TILE * n_d * (2 if lay.m_kind == F16 else 4) if lay.m_kind else 0,
        TILE * n_g if lay.m_neg_sub else 0,
    ]


def _put(dst: np.ndarray, t0: int, a: np.ndarray, element: np.dtype) -> None:
    """Rows of `a` ([n, ...]) into tiles t0.. of dst (uint8 [T, bytes per tile]): element e of row
    16 t + l (elements of `element`'s size: 4-byte words for the quant planes, else the scale's own type)
    lands at dst[t].view(element)[e * 16 + l]; rows past n in the last tile are zeros."""
    n = a.shape[0]
    a = np.ascontiguousarray(a).reshape(n, -1).view(element)  # [n, E]
    n_tiles, width = -(-n // TILE), a.shape[1]
    if n % TILE:
        a = np.concatenate([a, np.zeros((n_tiles * TILE - n, width), element)])
    dst[t0 : t0 + n_tiles].view(element).reshape(n_tiles, width, TILE)[...] = a.reshape(
        n_tiles, TILE, width
    ).transpose(0, 2, 1)


def pack_tiles(
    qtype: GGMLQuantizationType,
    raws: list[np.ndarray],
    cols: int,
    name: str | None = None,
    huge_pages: bool = True,
) -> PackedWeight:
    """Raw GGUF rows of one or more matrices of the same type and width (uint8 [rows_i, row_bytes] each,
    e.g. memory-mapped Q, K and V), stacked along the rows into one tile16 weight. Every part but the
    last must have a multiple of 16 rows (a tile never mixes two matrices). Works TILED_CHUNK_ROWS rows
    at a time straight into the final arrays (no full-size intermediate), chunks in parallel, and drops
    each chunk's pages of the file mapping from RSS once repacked (load_gguf's views only). huge_pages:
    the planes' page size (weight_memory.py)."""
    traits = get_traits(qtype, name)
    lay = TILE_LAYOUTS[qtype]
    row_bytes = traits.row_bytes(cols)
    for i, raw in enumerate(raws):
        if raw.ndim != 2 or raw.shape[1] != row_bytes:
            raise ValueError(f"{name or 'tensor'}: raw shape {raw.shape}, expected (rows, {row_bytes})")
        if i < len(raws) - 1 and raw.shape[0] % TILE:
            raise ValueError(
                f"{name or 'tensor'}: stacked part {i} has {raw.shape[0]} rows, not a multiple of {TILE}"
            )
    rows = sum(raw.shape[0] for raw in raws)
    n_tiles = -(-rows // TILE)
    planes = [weight_array(n_tiles, w, huge_pages) for w in _plane_widths(lay, cols)]
    jobs, t0 = [], 0  # (rows of one chunk, its first tile)
    for raw in raws:
        for r0 in range(0, raw.shape[0], TILED_CHUNK_ROWS):
            jobs.append((raw[r0 : r0 + TILED_CHUNK_ROWS], t0))
            t0 += -(-jobs[-1][0].shape[0] // TILE)

    def repack(job: tuple[np.ndarray, int]) -> None:
        chunk = lay.planes(job[0])
        fields = (chunk.lo, chunk.hi, chunk.d, chunk.sub, chunk.m, chunk.msub)
        for dst, a, word in zip(planes, fields, (True, True, False, False, False, False), strict=True):
            if dst.shape[1]:
                _put(dst, job[1], a, np.dtype(np.uint32) if word else a.dtype)
        release_mapped_pages(job[0])  # the chunk's file pages: repacked, out of RSS

    # numpy's copies release the GIL: chunks (disjoint tiles) repack on the engine's threads at once
    workers = min(len(jobs), numba.get_num_threads())
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(repack, jobs))
    else:
        for job in jobs:
            repack(job)
    tiles = Tiles(*planes, layout_id=LAYOUT_KEYS.index(lay.key))
    return PackedWeight(
        None, None, None, None, lay.group, rows, cols, qtype, act_mode=ACT_MODES[traits.vec_dot], tiles=tiles
    )


def pack_weight_tiled(
    qtype: GGMLQuantizationType, raw: np.ndarray, rows: int, cols: int, name: str | None = None
) -> PackedWeight:
    """One matrix in the layout the VNNI kernels stream (tile16), or pack_weight's for float types."""
    if qtype not in TILE_LAYOUTS:
        return pack_weight(qtype, raw, rows, cols, name)
    if raw.shape[0] != rows:
        raise ValueError(f"{name or 'tensor'}: raw has {raw.shape[0]} rows, expected {rows}")
    return pack_tiles(qtype, [raw], cols, name)


@njit(cache=True, nogil=True, parallel=True, fastmath=ORDERED_MATH)
def _gather_grouped(q, scale, minv, has_min, group, ids, out) -> None:
    k_cols = q.shape[1]
    g_u = U(group)
    for i in prange(ids.shape[0]):
        r = ids[i]
        for g in range(k_cols // group):
            base = U(g) * g_u
            s = scale[r, g]
            mn = minv[r, g] if has_min else np.float32(0.0)
            for k in range(U(0), g_u):
                v = s * np.float32(q[r, base + k])
                # Adding the min only when present keeps the result bit-identical to gguf's dequantize.
                out[i, base + k] = v + mn if has_min else v


def dequantize_rows_cpu(w: PackedWeight, ids: np.ndarray) -> np.ndarray:
    """Embedding lookup (get_rows): float32 [len(ids), K] rows of the weight."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= w.rows):
        raise IndexError(f"row ids out of range [0, {w.rows})")
    if w.dense is not None:
        return w.dense[ids]
    out = np.empty((ids.shape[0], w.cols), np.float32)
    if w.tiles is not None:
        lay = np.array(LAYOUT_KEYS[w.tiles.layout_id], np.int64)
        vnni.gather_tiles_cpu(w.tiles.planes, lay, ids, out)
        return out
    has_min = w.minv is not None
    _gather_grouped(w.q, w.scale, w.minv if has_min else w.scale, has_min, w.group, ids, out)
    return out
