"""Random weights of synthetic models in a tensor type's GGUF encoding.

Types gguf-py can quantize (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) go through `gguf.quants.quantize`.
Q4_K and Q6_K, which it cannot produce, can be quantized by the reference quantizers below (simple
min/max rules, not llama.cpp's search, but the exact block layout its dequantizer reads); every other
type is written as random raw blocks whose f16 scale fields are rescaled so the weights have the intended
spread.
"""

from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgellm.quants.layouts import BLOCK_DTYPES, QK_K

T = GGMLQuantizationType

# Types gguf.quants.quantize can produce (checked against gguf 0.19).
GGUF_QUANTIZABLE = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0})

# Mean quant level of the k-quants with a min (q uniform in 0..2^bits-1): dmin = d * this centres them.
_MEAN_QUANT_LEVEL = {T.Q2_K: 1.5, T.Q4_K: 7.5, T.Q5_K: 15.5}


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16)


def _blocks(w: np.ndarray) -> np.ndarray:
    w = np.ascontiguousarray(w, np.float32)
    if w.ndim != 2 or w.shape[1] % QK_K:
        raise ValueError(f"k-quant rows need a multiple of {QK_K} values, got shape {w.shape}")
    return w.reshape(-1, QK_K)


def quantize_q4_k_ref(w: np.ndarray) -> np.ndarray:
    """w [rows, cols] float -> Q4_K rows (rows, cols // 256 * 144) uint8: per 32-value sub-block a 6-bit
    scale and min, w ~ d * sc * q - dmin * m with q in 0..15."""
    x = _blocks(w).reshape(-1, 8, 32)  # [blocks, sub-block, value]
    lo = np.minimum(x.min(axis=2), 0.0)
    hi = np.maximum(x.max(axis=2), lo)
    sub_scale = (hi - lo) / 15.0  # [blocks, 8]
    sub_min = -lo
    d = _f16(sub_scale.max(axis=1) / 63.0)
    dmin = _f16(sub_min.max(axis=1) / 63.0)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(sub_scale / d32), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin32 > 0, np.rint(sub_min / dmin32), 0).clip(0, 63).astype(np.uint8)
        eff_scale = (d32 * sc)[:, :, None]
        eff_min = (dmin32 * m)[:, :, None]
        q = np.where(eff_scale > 0, np.rint((x + eff_min) / eff_scale), 0).clip(0, 15).astype(np.uint8)
    blocks = np.zeros(len(x), BLOCK_DTYPES[T.Q4_K])
    blocks["d"], blocks["dmin"] = d, dmin
    scales = blocks["scales"]  # 12 bytes: the 6-bit (sc, m) of sub-blocks 0-3 whole, 4-7 split (ggml)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    q = q.reshape(-1, 4, 2, 32)  # 64-value chunks: sub-block 2c in the low nibbles, 2c + 1 in the high
    blocks["qs"] = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    return blocks.view(np.uint8).reshape(w.shape[0], -1)


def quantize_q6_k_ref(w: np.ndarray) -> np.ndarray:
    """w [rows, cols] float -> Q6_K rows (rows, cols // 256 * 210) uint8: per 16-value sub-block an int8
    scale, w ~ d * sc * (q - 32) with q in 0..63."""
    x = _blocks(w).reshape(-1, 16, 16)
    sub_scale = np.abs(x).max(axis=2) / 31.0  # [blocks, 16]
    d = _f16(sub_scale.max(axis=1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(sub_scale / d32), 0).clip(0, 127).astype(np.int8)
        eff = (d32 * sc)[:, :, None]
        q = (np.where(eff > 0, np.rint(x / eff), 0).clip(-32, 31) + 32).astype(np.uint8)
    blocks = np.zeros(len(x), BLOCK_DTYPES[T.Q6_K])
    blocks["d"], blocks["scales"] = d, sc
    # ggml's order: per 128-value half h and l < 32, values l, l+32, l+64, l+96 share ql / qh bytes
    q = q.reshape(-1, 2, 4, 32)  # [blocks, half, quarter, l]
    low = q & 15
    ql = np.concatenate([low[:, :, 0] | low[:, :, 2] << 4, low[:, :, 1] | low[:, :, 3] << 4], axis=2)
    qh = (q[:, :, 0] >> 4) | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    blocks["ql"] = ql.reshape(-1, 128)
    blocks["qh"] = qh.reshape(-1, 64)
    return blocks.view(np.uint8).reshape(w.shape[0], -1)


KQUANT_REF: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    T.Q4_K: quantize_q4_k_ref,
    T.Q6_K: quantize_q6_k_ref,
}


class ScaleField:
    """A block field that multiplies every weight of the block: an f16 field (d, dmin, ...) by default."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get(self, blocks: np.ndarray) -> np.ndarray:
        return blocks[self.name].astype(np.float32)

    def set(self, blocks: np.ndarray, value: np.ndarray) -> None:
        blocks[self.name] = np.asarray(value).astype(np.float16)


class E8M0Scale(ScaleField):
    """MXFP4's `e`: a power of two (gguf's e8m0_to_fp32_half: 2^(e - 128)); set rounds to the nearest
    power, and drops the sign (the format has none)."""

    def get(self, blocks: np.ndarray) -> np.ndarray:
        return gguf.quants.MXFP4.e8m0_to_fp32_half(blocks[self.name].astype(np.uint32)).astype(np.float32)

    def set(self, blocks: np.ndarray, value: np.ndarray) -> None:
        with np.errstate(divide="ignore"):
            e = np.rint(np.log2(np.abs(np.asarray(value, np.float64)))) + 128
        blocks[self.name] = np.clip(np.nan_to_num(e, neginf=2), 2, 254).astype(np.uint8)


class SplitF16Scale(ScaleField):
    """IQ1_M's f16 d, held in the top nibbles of its four `scales` words (nibble i = bits 4i..4i+3)."""

    _SHIFTS = np.array([0, 4, 8, 12], np.uint16)

    def get(self, blocks: np.ndarray) -> np.ndarray:
        nibbles = (blocks[self.name] >> np.uint16(12)) << self._SHIFTS
        return np.bitwise_or.reduce(nibbles, axis=-1).view(np.float16).astype(np.float32)

    def set(self, blocks: np.ndarray, value: np.ndarray) -> None:
        bits = np.asarray(value).astype(np.float16).view(np.uint16)
        words = blocks[self.name] & np.uint16(0x0FFF)
        blocks[self.name] = words | (((bits[..., None] >> self._SHIFTS) & np.uint16(0xF)) << np.uint16(12))


_SPECIAL_SCALES: dict[GGMLQuantizationType, list[ScaleField]] = {
    T.MXFP4: [E8M0Scale("e")],
    T.IQ1_M: [SplitF16Scale("scales")],
}


def scale_fields(qtype: GGMLQuantizationType) -> list[ScaleField]:
    """The fields of `qtype`'s block that scale its weights (every f16 field, or the type's own form)."""
    if qtype in _SPECIAL_SCALES:
        return _SPECIAL_SCALES[qtype]
    dtype = BLOCK_DTYPES[qtype]
    return [ScaleField(f) for f in dtype.names if dtype[f].base == np.dtype("<f2")]


def _ternary_rows(
    qtype: GGMLQuantizationType, rows: int, cols: int, std: float, rng: np.random.Generator
) -> np.ndarray:
    """TQ1_0 / TQ2_0 rows of uniform random trits times a per-block scale, through gguf's own quantizer
    (exact for such input: its d is the block's largest magnitude), so every byte is one it writes."""
    trits = rng.integers(-1, 2, (rows * cols // QK_K, QK_K)).astype(np.float32)
    scale = rng.uniform(0.5, 1.0, (len(trits), 1)).astype(np.float16).astype(np.float32)
    w = trits * scale * np.float32(std / np.sqrt(2 / 3) / 0.75)
    return gguf.quants.quantize(w.reshape(rows, cols), qtype)


# Types whose random blocks need more than random bits and scales (every byte pattern of the others is valid)
_RAW_WRITERS: dict[GGMLQuantizationType, Callable[..., np.ndarray]] = {
    T.TQ1_0: _ternary_rows,
    T.TQ2_0: _ternary_rows,
}


def random_raw_blocks(
    qtype: GGMLQuantizationType, rows: int, cols: int, std: float, rng: np.random.Generator
) -> np.ndarray:
    """Random but valid raw rows (rows, row_bytes) of a block type gguf cannot quantize: random quant bits,
    scales (`scale_fields`) rescaled so the dequantized weights have standard deviation ~`std` (every such
    field of a block (d, dmin) multiplies the weights, so scaling them all scales the weights)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values, got {cols}")
    if qtype in _RAW_WRITERS:
        return _RAW_WRITERS[qtype](qtype, rows, cols, std, rng)
    raw = rng.integers(0, 256, (rows, cols // block * type_size), dtype=np.uint8)
    dtype = BLOCK_DTYPES.get(qtype)
    if dtype is None:  # a type we do not run: any bytes of the right size will do (error-path tests)
        return raw
    blocks = raw.view(dtype)
    fields = scale_fields(qtype)
    for f in fields:
        f.set(blocks, rng.uniform(0.5, 1.0, blocks.shape))
    if qtype in _MEAN_QUANT_LEVEL:  # w = d*sc*q - dmin*m: centre the weights (sc and m share a range)
        blocks["dmin"] = (blocks["d"].astype(np.float32) * _MEAN_QUANT_LEVEL[qtype]).astype(np.float16)
    got = float(gguf.quants.dequantize(raw, qtype).std()) or 1.0
    for f in fields:
        f.set(blocks, f.get(blocks) * (std / got))
    return raw


def encode_tensor(
    qtype: GGMLQuantizationType,
    shape: tuple[int, ...],
    std: float,
    mean: float,
    rng: np.random.Generator,
    quantize_kquants: bool = False,
) -> np.ndarray:
    """Random weights of `shape` in `qtype`'s GGUF encoding (uint8 rows for block types). With
    quantize_kquants, the types of KQUANT_REF are quantized from normal weights instead of random blocks."""
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if qtype in GGUF_QUANTIZABLE:
        w = (mean + std * rng.standard_normal(shape)).astype(np.float32)
        return w if qtype == T.F32 else gguf.quants.quantize(w, qtype)
    if quantize_kquants and qtype in KQUANT_REF:
        w = (mean + std * rng.standard_normal((rows, shape[-1]))).astype(np.float32)
        return KQUANT_REF[qtype](w).reshape(*shape[:-1], -1)
    return random_raw_blocks(qtype, rows, shape[-1], std, rng).reshape(*shape[:-1], -1)
