"""One table describing every supported GGML tensor type: sizes, repack group, reference entries.

Code elsewhere looks types up here (`get_traits`) instead of branching on the type, so adding a type means
adding one row. Unsupported types raise `UnsupportedQuantError` naming the type (and tensor, when known).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from edgellm.quants import unpack, unpack_iquants

T = GGMLQuantizationType


class UnsupportedQuantError(ValueError):
    """A tensor uses a GGML type this runtime cannot run."""


@dataclass(frozen=True)
class QuantTraits:
    qtype: GGMLQuantizationType
    name: str
    block_size: int  # weights per GGUF block
    type_size: int  # bytes per GGUF block
    group: int  # weights sharing one (scale, min) in the repacked form; 0 for float types (dense)
    has_min: bool
    unpack_ref: Callable[[np.ndarray], unpack.Unpacked] | None  # None: float type, repacked to dense f32
    dequantize_ref: Callable[[np.ndarray], np.ndarray]
    # How activations are quantized for the dot product, as llama.cpp's `vec_dot_type`: "q8_0" (per 32,
    # f16 scale), "q8_1" (q8_0 plus an f16 scaled sum, for types with a min), "q8_K" (per 256, f32 scale),
    # or the float type the activations are rounded to ("f32", "f16", "bf16"). Matching it is what makes
    # greedy tokens identical to llama.cpp's.
    vec_dot: str

    def row_bytes(self, cols: int) -> int:
        if cols % self.block_size:
            raise ValueError(
                f"{self.name}: row length {cols} is not a multiple of block size {self.block_size}"
            )
        return cols // self.block_size * self.type_size


def _dequantizer(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray]:
    def dequantize_ref(raw: np.ndarray) -> np.ndarray:
        return gguf_quants.dequantize(np.ascontiguousarray(raw, dtype=np.uint8), qtype)

    dequantize_ref.__name__ = f"dequantize_{qtype.name.lower()}_ref"
    return dequantize_ref


def _row(
    qtype: GGMLQuantizationType, group: int, has_min: bool, unpack_ref: Callable | None, vec_dot: str
) -> QuantTraits:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return QuantTraits(
        qtype=qtype,
        name=qtype.name,
        block_size=block_size,
        type_size=type_size,
        group=group,
        has_min=has_min,
        unpack_ref=unpack_ref,
        dequantize_ref=_dequantizer(qtype),
        vec_dot=vec_dot,
    )


QUANT_TRAITS: dict[GGMLQuantizationType, QuantTraits] = {
    t.qtype: t
    for t in (
        _row(T.F32, 0, False, None, "f32"),
        _row(T.F16, 0, False, None, "f16"),
        _row(T.BF16, 0, False, None, "bf16"),
        _row(T.Q4_0, 32, False, unpack.unpack_q4_0_ref, "q8_0"),
        _row(T.Q4_1, 32, True, unpack.unpack_q4_1_ref, "q8_1"),
        _row(T.Q5_0, 32, False, unpack.unpack_q5_0_ref, "q8_0"),
        _row(T.Q5_1, 32, True, unpack.unpack_q5_1_ref, "q8_1"),
        _row(T.Q8_0, 32, False, unpack.unpack_q8_0_ref, "q8_0"),
        _row(T.Q2_K, 16, True, unpack.unpack_q2_k_ref, "q8_K"),
        _row(T.Q3_K, 16, False, unpack.unpack_q3_k_ref, "q8_K"),
        _row(T.Q4_K, 32, True, unpack.unpack_q4_k_ref, "q8_K"),
        _row(T.Q5_K, 32, True, unpack.unpack_q5_k_ref, "q8_K"),
        _row(T.Q6_K, 16, False, unpack.unpack_q6_k_ref, "q8_K"),
        # vec_dot as ggml-cpu's type_traits_cpu: q8_0 for the block-32 IQ4_NL and MXFP4, q8_K for the rest
        _row(T.IQ4_NL, 32, False, unpack_iquants.unpack_iq4_nl_ref, "q8_0"),
        _row(T.IQ4_XS, 32, False, unpack_iquants.unpack_iq4_xs_ref, "q8_K"),
        _row(T.MXFP4, 32, False, unpack_iquants.unpack_mxfp4_ref, "q8_0"),
        _row(T.IQ3_S, 32, False, unpack_iquants.unpack_iq3_s_ref, "q8_K"),
        _row(T.IQ3_XXS, 32, False, unpack_iquants.unpack_iq3_xxs_ref, "q8_K"),
        _row(T.IQ2_XXS, 32, False, unpack_iquants.unpack_iq2_xxs_ref, "q8_K"),
        _row(T.IQ2_XS, 16, False, unpack_iquants.unpack_iq2_xs_ref, "q8_K"),
        _row(T.IQ2_S, 16, False, unpack_iquants.unpack_iq2_s_ref, "q8_K"),
        _row(T.IQ1_S, 32, False, unpack_iquants.unpack_iq1_s_ref, "q8_K"),
        _row(T.IQ1_M, 16, False, unpack_iquants.unpack_iq1_m_ref, "q8_K"),
        _row(T.TQ1_0, 256, False, unpack_iquants.unpack_tq1_0_ref, "q8_K"),
        _row(T.TQ2_0, 256, False, unpack_iquants.unpack_tq2_0_ref, "q8_K"),
    )
}


def get_traits(qtype: GGMLQuantizationType | int, tensor_name: str | None = None) -> QuantTraits:
    """Traits of `qtype`, or UnsupportedQuantError naming the type and (if given) the tensor."""
    traits = QUANT_TRAITS.get(qtype)  # type: ignore[call-overload]
    if traits is None:
        try:
            type_name = GGMLQuantizationType(qtype).name
        except ValueError:
            type_name = f"#{int(qtype)}"
        where = f" in tensor {tensor_name}" if tensor_name else ""
        supported = ", ".join(t.name for t in QUANT_TRAITS.values())
        raise UnsupportedQuantError(f"unsupported tensor type {type_name}{where} (supported: {supported})")
    return traits
