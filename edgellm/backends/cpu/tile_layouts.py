"""The VNNI kernels' weight layouts, one row per quant type: GGUF blocks at their own bit width, rows
interleaved 16 at a time ("tile16").

Every plane of a weight is tiled the same way: rows are taken 16 at a time (a tile) and interleaved by
4-byte words, so one 64-byte load holds the same word of 16 rows (one int32 lane each) and a `vpdpbusd`
with 4 activation bytes broadcast to every lane adds 4 products to each of 16 row sums at once.

- lo plane: the GGUF's quant bytes. Table types (IQ4_NL, IQ4_XS, MXFP4: `lut`) keep their 4-bit codes
  there; the kernel turns each nibble into its table value + 128 with one byte shuffle (`vpshufb`), so
  they run the same int8 dot products as Q4_0 at the file's bit width. Nibble types (`lo_split` B > 0):
  within each run of 2B columns, byte o holds column o in its low nibble and column B + o in its high
  nibble: ggml's order for Q4_0/Q4_1/Q5_* (B=16). The K-quants' nibbles (ggml's B=32 for Q4_K/Q5_K, B=64
  for Q6_K) are moved at load into that B=16 order, and their high bits into Q5_0's form (below): the
  same bytes, elsewhere in the row, so that a 32-column unit needs only its own words of each row; in
  the file's order a 64- or 128-column unit keeps all its words live at once, which spilled registers on
  the 256-bit tiers and streamed Q6_K slower at batch 1 (docs/benchmarks.md, "K-quants in the legacy
  order"). Byte types (B = 0): one byte per column, offset by 128 (Q8_0's int8 ^ 0x80) because
  `vpdpbusd` multiplies unsigned weights.
- hi plane (`hi_bits` 1 or 2): the high bits: bit-field i of byte o holds column `hi_stride` * i + o of
  the unit (Q5_0/Q5_1's 32-bit qh and the K-quants' qh are rearranged into this form at load).
- scales: `d` per `d_cols` columns (f16 bits as the file has them, widened in the kernel; f32 only for
  the types repacked through int8), times an 8-bit sub-scale per group where the format has one (the
  K-quants' 6-bit scales as bytes, Q6_K's int8 scales); the min term likewise (`m`, `msub`).

The kernel computes, per group, exactly the float expression of the portable kernels over the int8 rows
(scale = f32(d) * f32(sub), min = -(f32(dmin) * f32(mn)) or f32(m)), so outputs are bit-identical.
Q2_K/Q3_K (rare), the grid i-quants (IQ1/IQ2/IQ3) and the ternary types go through the int8 rows
(`unpack_ref`) into a byte plane with f32 scales: exact, at 8 bits a weight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from edgellm.backends.cpu.k_quant_order import regroup_fields, split16
from edgellm.quants.layouts import view_blocks
from edgellm.quants.traits import get_traits
from edgellm.quants.unpack_iquants import iq4_xs_sub_scales

T = GGMLQuantizationType
TILE = 16  # weight rows per tile = int32 lanes of a zmm

# Scale element kinds (kernel and gather switch on these small ints).
F16, F32, E8M0 = 1, 2, 3  # d / m: f16 bits, f32, or MXFP4's exponent byte (2^(e - 128), gguf's "half")
U8, I8 = 1, 2  # sub-scales: unsigned or signed bytes


@dataclass(frozen=True)
class TileLayout:
    lo_split: int  # B: low nibble of byte o -> column o, high nibble -> B + o (per 2B columns); 0: bytes
    hi_bits: int  # high bits per weight in the hi plane (0: none)
    hi_stride: int  # bit-field i of hi byte o -> column hi_stride * i + o of the unit
    offset: int  # stored unsigned value - offset = the signed quant of the row layout
    group: int  # columns per (sub-)scale
    unit: int  # columns the kernel handles per step (a whole number of groups, lo runs and hi fields)
    d_cols: int  # columns per d (and per m)
    d_kind: int  # F16 or F32
    sub_kind: int  # 0, U8 or I8: per-group sub-scale multiplying d
    m_kind: int  # 0 (no min term), F16 or F32
    m_neg_sub: bool  # min = -(m * msub) (K-quants) instead of m
    planes: Callable[[np.ndarray], Planes]  # raw rows uint8 [N, row_bytes] -> the planes, row-major
    lut: tuple[int, ...] = ()  # 16 stored values a nibble selects (table types), or () for the nibble itself

    @property
    def key(self) -> tuple:
        """What the kernel's code depends on (types sharing it share one compiled variant): 11 ints, then
        the 16 table entries for a table type."""
        return (
            self.lo_split, self.hi_bits, self.hi_stride, self.offset, self.group, self.unit,
            self.d_cols, self.d_kind, self.sub_kind, self.m_kind, self.m_neg_sub, *self.lut,
        )  # fmt: skip

    def lo_bytes(self, cols: int) -> int:
        return cols // 2 if self.lo_split else cols

    def hi_bytes(self, cols: int) -> int:
        return cols * self.hi_bits // 8


@dataclass
class Planes:
    """One weight's planes before tiling, rows first: each array is [N, ...] (views of the raw blocks
    where the file's form is kept)."""

    lo: np.ndarray  # uint8 [N, ..., lo bytes]
    hi: np.ndarray | None  # uint8 [N, ..., hi bytes]
    d: np.ndarray  # uint16 (f16 bits), f32 or uint8 (E8M0) [N, K // d_cols]
    sub: np.ndarray | None  # uint8 / int8 [N, ..., K // group]
    m: np.ndarray | None  # like d
    msub: np.ndarray | None  # uint8 [N, ..., K // group]


def _f16_bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


def _k_scale_min_u8(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte field -> 8 six-bit scales and 8 six-bit mins as bytes (ggml get_scale_min_k4)."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


_QH_BITS = np.arange(32, dtype=np.uint32)


def _q5_qh_bytes(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 qh (uint32 [...], bit j = column j's high bit) -> 4 bytes [..., 4] with bit i of byte o =
    column 4i + o (hi_stride 4), so the 4 bytes of a word give a column each, like the lo plane."""
    bits = (qh[..., None] >> _QH_BITS) & np.uint32(1)  # [..., 32], column j
    bits = bits.reshape((*qh.shape, 8, 4)).swapaxes(-1, -2)  # [..., o, i]: column 4i + o
    return (bits << np.arange(8, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32).astype(np.uint8)


def _planes_q4_0(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q4_0)
    return Planes(b["qs"], None, _f16_bits(b["d"]), None, None, None)


def _planes_q4_1(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q4_1)
    return Planes(b["qs"], None, _f16_bits(b["d"]), None, _f16_bits(b["m"]), None)


def _planes_q5_0(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q5_0)
    return Planes(b["qs"], _q5_qh_bytes(b["qh"]), _f16_bits(b["d"]), None, None, None)


def _planes_q5_1(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q5_1)
    return Planes(b["qs"], _q5_qh_bytes(b["qh"]), _f16_bits(b["d"]), None, _f16_bits(b["m"]), None)


def _planes_q8_0(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q8_0)
    return Planes(b["qs"].view(np.uint8) ^ np.uint8(0x80), None, _f16_bits(b["d"]), None, None, None)


def _planes_q4_k(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q4_K)
    sc, mn = _k_scale_min_u8(b["scales"])
    return Planes(split16(b["qs"], 32), None, _f16_bits(b["d"]), sc, _f16_bits(b["dmin"]), mn)


def _planes_q5_k(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q5_K)
    sc, mn = _k_scale_min_u8(b["scales"])
    qh = regroup_fields(b["qh"], 1)
    return Planes(split16(b["qs"], 32), qh, _f16_bits(b["d"]), sc, _f16_bits(b["dmin"]), mn)


def _planes_q6_k(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.Q6_K)
    ql, qh = split16(b["ql"], 64), regroup_fields(b["qh"], 2)
    return Planes(ql, qh, _f16_bits(b["d"]), b["scales"], None, None)


def _stored_table(values: tuple[int, ...]) -> tuple[int, ...]:
    """A type's 16 signed table values as the unsigned bytes the kernel multiplies (offset 128)."""
    return tuple(int(v) + 128 for v in values)


_IQ4NL_LUT = _stored_table(gguf_quants.IQ4_NL.kvalues)
_MXFP4_LUT = _stored_table(gguf_quants.MXFP4.kvalues)


def _planes_iq4_nl(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.IQ4_NL)
    return Planes(b["qs"], None, _f16_bits(b["d"]), None, None, None)


def _planes_iq4_xs(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.IQ4_XS)
    return Planes(b["qs"], None, _f16_bits(b["d"]), iq4_xs_sub_scales(b), None, None)


def _planes_mxfp4(raw: np.ndarray) -> Planes:
    b = view_blocks(raw, T.MXFP4)
    return Planes(b["qs"], None, b["e"], None, None, None)


def _planes_via_int8(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], Planes]:
    """Types kept as int8 rows + f32 scales (Q2_K, Q3_K, ...): the reference unpacker's output as planes."""

    def planes(raw: np.ndarray) -> Planes:
        q, scale, minv = get_traits(qtype).unpack_ref(raw)
        return Planes(q.view(np.uint8) ^ np.uint8(0x80), None, scale, None, minv, None)

    return planes


def _via_int8(qtype: GGMLQuantizationType) -> TileLayout:
    """A type without a min kept as int8 bytes and one f32 scale per group (the traits' group)."""
    g = get_traits(qtype).group
    return TileLayout(0, 0, 4, 128, g, g, g, F32, 0, 0, False, _planes_via_int8(qtype))


def _legacy(planes, split: int, hi_bits: int, offset: int, m_kind: int) -> TileLayout:
    """Q4_0 .. Q8_0: blocks of 32 with one f16 d (and m) each."""
    return TileLayout(split, hi_bits, 4, offset, 32, 32, 32, F16, 0, m_kind, False, planes)


# The grid i-quants and the ternary types: no layout at their own bit width (yet), int8 bytes instead
_GRID_TYPES = (T.IQ3_S, T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0)

TILE_LAYOUTS: dict[GGMLQuantizationType, TileLayout] = {
    T.Q4_0: _legacy(_planes_q4_0, 16, 0, 8, 0),
    T.Q4_1: _legacy(_planes_q4_1, 16, 0, 0, F16),
    T.Q5_0: _legacy(_planes_q5_0, 16, 1, 16, 0),
    T.Q5_1: _legacy(_planes_q5_1, 16, 1, 0, F16),
    T.Q8_0: _legacy(_planes_q8_0, 0, 0, 128, 0),
    T.Q4_K: TileLayout(16, 0, 4, 0, 32, 32, 256, F16, U8, F16, True, _planes_q4_k),
    T.Q5_K: TileLayout(16, 1, 4, 0, 32, 32, 256, F16, U8, F16, True, _planes_q5_k),
    T.Q6_K: TileLayout(16, 2, 8, 32, 16, 32, 256, F16, I8, 0, False, _planes_q6_k),
    T.Q2_K: TileLayout(0, 0, 4, 128, 16, 16, 16, F32, 0, F32, False, _planes_via_int8(T.Q2_K)),
    T.Q3_K: _via_int8(T.Q3_K),
    T.IQ4_NL: TileLayout(16, 0, 4, 128, 32, 32, 32, F16, 0, 0, False, _planes_iq4_nl, _IQ4NL_LUT),
    T.IQ4_XS: TileLayout(16, 0, 4, 128, 32, 64, 256, F16, I8, 0, False, _planes_iq4_xs, _IQ4NL_LUT),
    T.MXFP4: TileLayout(16, 0, 4, 128, 32, 32, 32, E8M0, 0, 0, False, _planes_mxfp4, _MXFP4_LUT),
    **{qtype: _via_int8(qtype) for qtype in _GRID_TYPES},
}

# Distinct kernel layouts in a fixed order: the kernels' variant ids.
LAYOUT_KEYS: list[tuple] = list(dict.fromkeys(lay.key for lay in TILE_LAYOUTS.values()))
