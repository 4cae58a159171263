"""Repacked weights as host code shares them: the form every backend's weights are built from (the CPU
kernels stream it, the CUDA backend uploads it), how projections are stacked into one matrix, and the
activation quantization modes a weight asks for. No backend code lives here, so any backend may import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.quants.traits import get_traits

# Activation quantization modes (llama.cpp's vec_dot_type of the weight type).
ACT_Q8_0 = 0  # blocks of 32, d = amax/127 stored as f16, q = rint(x * 127/amax)
ACT_Q8_1 = 1  # q8_0 plus s = f16(d * sum(q)) per block, for the min term of Q4_1/Q5_1
ACT_Q8_K = 2  # blocks of 256, d = max/-127 as f32 (max: the signed value of largest magnitude)
ACT_MODES = {"q8_0": ACT_Q8_0, "q8_1": ACT_Q8_1, "q8_K": ACT_Q8_K}


def _round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


ACT_ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "f32": None,
    "f16": _round_f16,
    "bf16": _round_bf16,
}


@dataclass
class Tiles:
    """The CPU backend's VNNI layout (backends/cpu/tile_layouts.py): the weight at its GGUF bit width, rows
    interleaved 16 at a time. Each plane is uint8 [T, bytes per tile]; an absent plane is [T, 0]."""

    lo: np.ndarray  # quants (nibbles or bytes)
    hi: np.ndarray  # high bits
    d: np.ndarray  # scales (f16 bits or f32)
    sub: np.ndarray  # per-group sub-scales (bytes)
    m: np.ndarray  # mins (f16 bits or f32)
    msub: np.ndarray  # per-group sub-mins (bytes)
    layout_id: int  # index of the layout's key in tile_layouts.LAYOUT_KEYS

    @property
    def planes(self) -> tuple[np.ndarray, ...]:
        return (self.lo, self.hi, self.d, self.sub, self.m, self.msub)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.planes)


@dataclass
class PackedWeight:
    q: np.ndarray | None  # int8 [N, K], None for float types
    scale: np.ndarray | None  # f32 [N, K // group]
    minv: np.ndarray | None  # f32 [N, K // group], None when the type has no min term
    dense: np.ndarray | None  # f32 [N, K] for float types, else None
    group: int  # 0 for float types
    rows: int  # N (output features)
    cols: int  # K (input features)
    qtype: GGMLQuantizationType
    act_mode: int = ACT_Q8_0  # how activations are quantized (ACT_* above), from the traits' vec_dot
    act_round: Callable[[np.ndarray], np.ndarray] | None = None  # float weights: activation rounding
    tiles: Tiles | None = None  # the CPU VNNI layout; q, scale and minv are then None

    @property
    def nbytes(self) -> int:
        """Bytes the kernels stream per full pass over the weight."""
        arrays = (self.q, self.scale, self.minv, self.dense)
        tiles = self.tiles.nbytes if self.tiles is not None else 0
        return sum(a.nbytes for a in arrays if a is not None) + tiles


def stack_packed(parts: list[PackedWeight]) -> PackedWeight:
    """Stack repacked matrices along the output rows (Q|K|V, gate|up) so one matmul call serves them.
    Possible whenever they share the repacked form (same group; a missing min is a zero min)."""
    first = parts[0]
    rows = sum(p.rows for p in parts)
    if first.dense is not None:
        dense = np.concatenate([p.dense for p in parts], axis=0)
        return PackedWeight(
            q=None,
            scale=None,
            minv=None,
            dense=dense,
            group=0,
            rows=rows,
            cols=first.cols,
            qtype=first.qtype,
            act_round=first.act_round,
        )
    any_min = any(p.minv is not None for p in parts)
    minv = (
        np.concatenate([p.minv if p.minv is not None else np.zeros_like(p.scale) for p in parts], axis=0)
        if any_min
        else None
    )
    return PackedWeight(
        q=np.concatenate([p.q for p in parts], axis=0),
        scale=np.concatenate([p.scale for p in parts], axis=0),
        minv=minv,
        dense=None,
        group=first.group,
        rows=rows,
        cols=first.cols,
        qtype=first.qtype,
        act_mode=first.act_mode,
    )


def stackable(parts: list[PackedWeight]) -> bool:
    """Whether stack_packed can merge these parts (the same repacked form and activation handling)."""
    first = parts[0]
    return all(
        (p.dense is None) == (first.dense is None)
        and p.group == first.group
        and p.act_mode == first.act_mode
        and p.act_round is first.act_round
        for p in parts
    )


def pack_weight(
    qtype: GGMLQuantizationType, raw: np.ndarray, rows: int, cols: int, name: str | None = None
) -> PackedWeight:
    """Repack raw GGUF rows (uint8 [rows, row_bytes]) for the CPU kernels."""
    traits = get_traits(qtype, name)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    expected = (rows, traits.row_bytes(cols))
    if raw.shape != expected:
        raise ValueError(f"{name or 'tensor'}: raw shape {raw.shape}, expected {expected} for {traits.name}")
    if traits.unpack_ref is None:
        dense = np.ascontiguousarray(traits.dequantize_ref(raw).reshape(rows, cols), dtype=np.float32)
        return PackedWeight(
            None, None, None, dense, 0, rows, cols, traits.qtype, act_round=ACT_ROUNDING[traits.vec_dot]
        )
    q, scale, minv = traits.unpack_ref(raw)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    minv = None if minv is None else np.ascontiguousarray(minv, dtype=np.float32)
    return PackedWeight(
        q, scale, minv, None, traits.group, rows, cols, traits.qtype, act_mode=ACT_MODES[traits.vec_dot]
    )


def dequantize_packed(w: PackedWeight) -> np.ndarray:
    """The whole weight as float32 [N, K], from its row layout: scale * q (+ min), the same float
    operations in the same order as the kernels' row gather, so the values are bit-identical to it."""
    if w.dense is not None:
        return w.dense
    if w.q is None:
        raise ValueError("dequantize_packed needs the row layout (q, scale), not tiles")
    n, k = w.q.shape
    grouped = w.q.reshape(n, k // w.group, w.group).astype(np.float32) * w.scale[:, :, None]
    if w.minv is not None:
        grouped += w.minv[:, :, None]
    return grouped.reshape(n, k)
