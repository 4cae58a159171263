"""Numpy reference unpackers: raw GGUF rows -> the uniform "int8 grouped" form.

Every quant type becomes `q: int8 [N, K]`, `scale: f32 [N, K//G]`, `minv: f32 [N, K//G] | None`, with
weight[n, k] == scale[n, k//G] * q[n, k] + minv[n, k//G]. The float ops mirror gguf.quants.dequantize
(scale is formed exactly as gguf forms its per-sub-block factor, and minv is the negated min term), so the
reconstruction is bit-identical to the reference. Runs once per tensor at load time: clarity over speed.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.quants.layouts import view_blocks

T = GGMLQuantizationType
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray | None]

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8)


def _f32(half: np.ndarray) -> np.ndarray:
    return half.astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """(..., n*width) packed bytes -> (..., n, 2, width): low then high nibbles per width-chunk."""
    chunks = qs.reshape((*qs.shape[:-1], -1, 1, width))
    return (chunks >> _NIBBLE_SHIFTS.reshape(2, 1)) & np.uint8(0x0F)


def _flat(q: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(q.reshape(rows, -1).astype(np.int8))


def _bits32(qh: np.ndarray) -> np.ndarray:
    """uint32 (...,) -> (..., 32) of 0/1, bit j for element j (Q5_0/Q5_1 high bits)."""
    return ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def unpack_q4_0_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q4_0)
    q = _nibbles(b["qs"], 16).astype(np.int8) - np.int8(8)
    return _flat(q, len(b)), _f32(b["d"]), None


def unpack_q4_1_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q4_1)
    return _flat(_nibbles(b["qs"], 16), len(b)), _f32(b["d"]), _f32(b["m"])


def unpack_q5_0_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q5_0)
    low = _nibbles(b["qs"], 16).reshape((*b.shape, 32))
    q = (low | (_bits32(b["qh"]) << np.uint8(4))).astype(np.int8) - np.int8(16)
    return _flat(q, len(b)), _f32(b["d"]), None


def unpack_q5_1_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q5_1)
    low = _nibbles(b["qs"], 16).reshape((*b.shape, 32))
    q = low | (_bits32(b["qh"]) << np.uint8(4))
    return _flat(q, len(b)), _f32(b["d"]), _f32(b["m"])


def unpack_q8_0_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q8_0)
    return _flat(b["qs"], len(b)), _f32(b["d"]), None


def unpack_q2_k_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q2_K)
    rows, nb = b.shape
    d, dmin = _f32(b["d"])[..., None], _f32(b["dmin"])[..., None]
    scale = d * (b["scales"] & np.uint8(0x0F)).astype(np.float32)
    minv = -(dmin * (b["scales"] >> np.uint8(4)).astype(np.float32))
    # 64 bytes = 2 halves of 32; each half holds 4 crumb planes of 32 elements (element order half, plane, i).
    q = (b["qs"].reshape(rows, nb, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(4, 1)) & np.uint8(3)
    return _flat(q, rows), scale.reshape(rows, -1), minv.reshape(rows, -1)


def unpack_q3_k_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q3_K)
    rows, nb = b.shape
    packed = b["scales"]
    low = (packed[..., :8, None] >> _NIBBLE_SHIFTS).transpose(0, 1, 3, 2).reshape(rows, nb, 16)
    high = (packed[..., 8:, None] >> _CRUMB_SHIFTS).transpose(0, 1, 3, 2).reshape(rows, nb, 16)
    sc = ((low & np.uint8(0x0F)) | ((high & np.uint8(0x03)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    scale = _f32(b["d"])[..., None] * sc.astype(np.float32)
    ql = (b["qs"].reshape(rows, nb, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(4, 1)) & np.uint8(3)
    qh = (b["hmask"].reshape(rows, nb, 1, 32) >> _BIT_SHIFTS.reshape(8, 1)) & np.uint8(1)
    # A clear hmask bit means "subtract 4" (ggml's convention).
    q = ql.reshape(rows, nb, 8, 32).astype(np.int8) - ((qh ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    return _flat(q, rows), scale.reshape(rows, -1), None


def _k_scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte field -> 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def unpack_q4_k_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q4_K)
    rows = len(b)
    sc, mn = _k_scale_min(b["scales"])
    scale = _f32(b["d"])[..., None] * sc
    minv = -(_f32(b["dmin"])[..., None] * mn)
    return _flat(_nibbles(b["qs"], 32), rows), scale.reshape(rows, -1), minv.reshape(rows, -1)


def unpack_q5_k_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q5_K)
    rows, nb = b.shape
    sc, mn = _k_scale_min(b["scales"])
    scale = _f32(b["d"])[..., None] * sc
    minv = -(_f32(b["dmin"])[..., None] * mn)
    low = _nibbles(b["qs"], 32).reshape(rows, nb, 8, 32)
    high = (b["qh"].reshape(rows, nb, 1, 32) >> _BIT_SHIFTS.reshape(8, 1)) & np.uint8(1)
    return _flat(low | (high << np.uint8(4)), rows), scale.reshape(rows, -1), minv.reshape(rows, -1)


def unpack_q6_k_ref(raw: np.ndarray) -> Unpacked:
    b = view_blocks(raw, T.Q6_K)
    rows, nb = b.shape
    scale = _f32(b["d"])[..., None] * b["scales"].astype(np.float32)
    low = _nibbles(b["ql"], 64).reshape(rows, nb, 8, 32)
    high = ((b["qh"].reshape(rows, nb, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(4, 1)) & np.uint8(3)).reshape(
        rows, nb, 8, 32
    )
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    return _flat(q, rows), scale.reshape(rows, -1), None
