"""Numpy reference unpackers of the i-quants, MXFP4 and the ternary types into the "int8 grouped" form.

Each maps exactly onto q int8 [N, K] times a per-group f32 scale (no min):
- IQ4_NL / IQ4_XS / MXFP4: 4-bit codes through a 16-entry int8 table, times the block's (sub-)scale.
- IQ2_* / IQ3_*: grid vectors (8 or 4 small positive values per index) with sign flips, times the
  sub-block scale gguf forms (e.g. d * (0.5 + s) * 0.25).
- IQ1_S / IQ1_M: grid values in {-1, 0, 1} plus a delta of +-1/8, stored as 8 * grid +- 1 with scale / 8.
- TQ1_0 / TQ2_0: ternary (TQ2_0: 2-bit, -1..2) times the per-256 f16 scale.

The tables (16-entry value tables, sign patterns, grids) are gguf-py's own (`gguf.quants`), not retyped: the
same constants its reference dequantizers use. Scales are formed with gguf's float expressions, so scale * q
is bit-identical to gguf.quants.dequantize (tests/kernels/test_backend_ops.py checks every type); for IQ1_*,
dl * (grid + delta) and (dl / 8) * (8 * grid +- 1) are both the one rounding of the same exact product.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gq

from edgellm.quants.layouts import view_blocks
from edgellm.quants.unpack import Unpacked, _flat, _nibbles

T = GGMLQuantizationType

_KVALUES_IQ4NL = np.array(gq.IQ4_NL.kvalues, np.int8)  # [16]
_KVALUES_MXFP4 = np.array(gq.MXFP4.kvalues, np.int8)  # [16], e2m1 values doubled
_KSIGNS = np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8)  # [128] 7-bit index -> 8 sign bits (even parity)
_BITS = np.arange(8, dtype=np.uint8)
_SIGN_SHIFTS = np.array([0, 7, 14, 21], dtype=np.uint32)
_DELTA_STEPS = 8  # IQ1's delta is 1/8: 8 * (grid +- 1/8) = 8 * grid +- 1


@functools.cache
def _grid(cls: type) -> np.ndarray:
    """int8 [entries, values per entry]: gguf's decoded grid of an i-quant class."""
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(cls.grid_shape).astype(np.int8))


def _sign_bits(bytes_: np.ndarray) -> np.ndarray:
    """uint8 [...] of sign bytes -> int8 [..., 8]: +1 / -1 for bit j clear / set."""
    bits = (bytes_[..., None] >> _BITS) & np.uint8(1)
    return (np.int8(1) - (bits.astype(np.int8) << np.int8(1))).astype(np.int8)


def _ksign_bits(index7: np.ndarray) -> np.ndarray:
    return _sign_bits(_KSIGNS[index7])


def unpack_iq4_nl_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ4_NL)
    return _flat(_KVALUES_IQ4NL[_nibbles(b["qs"], 16)], len(b)), b["d"].astype(np.float32), None


def iq4_xs_sub_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks [rows, nb] -> int8 [rows, nb, 8]: the six-bit scale of each 32 values, less 32 (low
    nibbles in scales_l, high 2 bits in scales_h)."""
    rows, nb = b.shape
    low = (b["scales_l"][..., None] >> np.array([0, 4], np.uint8)).reshape(rows, nb, 8) & np.uint8(0x0F)
    high = (b["scales_h"][..., None] >> (2 * np.arange(8, dtype=np.uint16))).astype(np.uint8) & np.uint8(3)
    return (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)


def unpack_iq4_xs_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ4_XS)
    rows = len(b)
    scale = b["d"].astype(np.float32)[..., None] * iq4_xs_sub_scales(b).astype(np.float32)
    q = _KVALUES_IQ4NL[_nibbles(b["qs"], 16)]
    return _flat(q, rows), scale.reshape(rows, -1), None


def unpack_mxfp4_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.MXFP4)
    scale = gq.MXFP4.e8m0_to_fp32_half(b["e"].astype(np.uint32)).astype(np.float32)
    return _flat(_KVALUES_MXFP4[_nibbles(b["qs"], 16)], len(b)), scale, None


def _quarter_scale(d: np.ndarray, s: np.ndarray, step: float) -> np.ndarray:
    """gguf's IQ2/IQ3_XXS sub-block scale d * (0.5 + s) * step, f32."""
    return d.astype(np.float32)[..., None] * (np.float32(0.5) + s.astype(np.float32)) * np.float32(step)


def unpack_iq2_xxs_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ2_XXS)
    rows, nb = b.shape
    sub = np.ascontiguousarray(b["qs"]).view(np.uint8).reshape(rows, nb, 8, 8)  # per 32 values: 8 bytes
    grid_idx = sub[..., :4]  # 4 grid indices, then a u32 of 4 x 7-bit sign indices and the 4-bit scale
    aux = np.ascontiguousarray(sub[..., 4:]).view("<u4")[..., 0]
    signs = _ksign_bits((aux[..., None] >> _SIGN_SHIFTS) & np.uint32(0x7F))  # [rows, nb, 8, 4, 8]
    q = _grid(gq.IQ2_XXS)[grid_idx] * signs
    return _flat(q, rows), _quarter_scale(b["d"], aux >> np.uint32(28), 0.25).reshape(rows, -1), None


def _nibble_scales(scales: np.ndarray) -> np.ndarray:
    """[..., n] bytes -> [..., 2n] of their low then high nibbles (one scale per 16 values)."""
    nibbles = (scales[..., None] >> np.array([0, 4], np.uint8)) & np.uint8(0x0F)
    return nibbles.reshape(*scales.shape[:-1], -1)


def unpack_iq2_xs_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ2_XS)
    rows = len(b)
    qs = b["qs"]  # [rows, nb, 32] u16: 9-bit grid index, 7-bit sign index
    q = _grid(gq.IQ2_XS)[qs & np.uint16(511)] * _ksign_bits(qs >> np.uint16(9))
    scale = _quarter_scale(b["d"], _nibble_scales(b["scales"]), 0.25)
    return _flat(q, rows), scale.reshape(rows, -1), None


def unpack_iq2_s_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ2_S)
    rows, nb = b.shape
    high = (b["qh"][..., None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)  # [rows, nb, 8, 4]
    index = b["qs"].astype(np.uint16) | (high.reshape(rows, nb, 32).astype(np.uint16) << np.uint16(8))
    q = _grid(gq.IQ2_S)[index] * _sign_bits(b["signs"])
    scale = _quarter_scale(b["d"], _nibble_scales(b["scales"]), 0.25)
    return _flat(q, rows), scale.reshape(rows, -1), None


def unpack_iq3_xxs_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ3_XXS)
    rows, nb = b.shape
    aux = b["scales_signs"]  # [rows, nb, 8]: 4 x 7-bit sign indices, 4-bit scale on top
    signs = _ksign_bits((aux[..., None] >> _SIGN_SHIFTS) & np.uint32(0x7F)).reshape(rows, nb, 8, 8, 4)
    q = _grid(gq.IQ3_XXS)[b["qs"]].reshape(rows, nb, 8, 8, 4) * signs
    return _flat(q, rows), _quarter_scale(b["d"], aux >> np.uint32(28), 0.5).reshape(rows, -1), None


def unpack_iq3_s_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ3_S)
    rows, nb = b.shape
    high = ((b["qh"][..., None] >> _BITS) & np.uint8(1)).reshape(rows, nb, 64).astype(np.uint16)
    index = b["qs"].astype(np.uint16) | (high << np.uint16(8))
    q = _grid(gq.IQ3_S)[index].reshape(rows, nb, 32, 8) * _sign_bits(b["signs"])
    sc = _nibble_scales(b["scales"])  # [rows, nb, 8], one per 32 values
    scale = b["d"].astype(np.float32)[..., None] * (1 + 2 * sc)
    return _flat(q, rows), scale.reshape(rows, -1), None


def _iq1_q(grid_idx: np.ndarray, negative_delta: np.ndarray) -> np.ndarray:
    """8 * grid +- 1 (int8 [..., 8]) for grid indices and per-entry delta signs of matching shape."""
    delta = np.where(negative_delta, np.int8(-1), np.int8(1))[..., None]
    return _grid(gq.IQ1_S)[grid_idx] * np.int8(_DELTA_STEPS) + delta


def unpack_iq1_s_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ1_S)
    rows, nb = b.shape
    qh = b["qh"]  # [rows, nb, 8]: 4 x 3 high index bits, 3-bit scale, delta sign on top
    high = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)
    index = b["qs"].astype(np.uint16) | (high.reshape(rows, nb, 32) << np.uint16(8))
    negative = np.repeat((qh & np.uint16(0x8000)) != 0, 4, axis=-1)
    dl = b["d"].astype(np.float32)[..., None] * (2 * ((qh >> 12) & 7) + 1)
    scale = dl * np.float32(1 / _DELTA_STEPS)
    return _flat(_iq1_q(index, negative), rows), scale.reshape(rows, -1), None


def unpack_iq1_m_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.IQ1_M)
    rows, nb = b.shape
    sc = b["scales"]  # [rows, nb, 4] u16: 4 x 3-bit scales each, one nibble of the f16 d on top
    d_bits = (sc >> np.array([12, 8, 4, 0], np.uint16)) & np.array([0xF, 0xF0, 0xF00, 0xF000], np.uint16)
    d = np.bitwise_or.reduce(d_bits, axis=-1).view(np.float16).astype(np.float32)
    s3 = ((sc[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)).reshape(rows, nb, 16)
    dl = d[..., None] * (2 * s3 + 1)  # [rows, nb, 16], one per 16 values
    nib = (b["qh"][..., None] >> np.array([0, 4], np.uint8)).reshape(rows, nb, 32)  # per 8 values
    index = b["qs"].astype(np.uint16) | ((nib & np.uint8(7)).astype(np.uint16) << np.uint16(8))
    q = _iq1_q(index, (nib & np.uint8(8)) != 0)
    return _flat(q, rows), (dl * np.float32(1 / _DELTA_STEPS)).reshape(rows, -1), None


_POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(qs: np.ndarray, digits: int) -> np.ndarray:
    """Base-3 digits as ggml stores them: digit j of byte x is ((x * 3^j mod 256) * 3) >> 8; the digits of a
    run of bytes come digit-major (all bytes' digit 0, then digit 1, ...)."""
    x = qs[..., None, :] * _POW3[:digits, None]  # uint8 arithmetic wraps mod 256, as ggml's
    return ((x.astype(np.uint16) * 3) >> 8).astype(np.int8).reshape(*qs.shape[:-1], -1)


def unpack_tq1_0_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.TQ1_0)
    rows = len(b)
    qs = b["qs"]  # 48 bytes: 32 then 16 bytes of 5 trits each, then qh: 4 bytes of 4 trits
    digits = np.concatenate([_trits(qs[..., :32], 5), _trits(qs[..., 32:], 5), _trits(b["qh"], 4)], axis=-1)
    return _flat(digits - np.int8(1), rows), b["d"].astype(np.float32), None


def unpack_tq2_0_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.TQ2_0)
    rows, nb = b.shape
    crumbs = (b["qs"].reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & np.uint8(3)
    return _flat(crumbs.astype(np.int8) - np.int8(1), rows), b["d"].astype(np.float32), None
