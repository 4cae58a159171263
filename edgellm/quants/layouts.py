"""GGML block layouts as numpy structured dtypes (mirrors ggml's block_q4_0, block_q4_K, ...).

A raw GGUF row of `row_bytes` uint8 viewed with one of these dtypes gives an array of blocks whose fields
can be unpacked with vectorised numpy (see unpack.py). Itemsizes are checked against gguf's table at import
so a layout typo fails loudly instead of producing garbage weights.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

T = GGMLQuantizationType

BLOCK_DTYPES: dict[GGMLQuantizationType, np.dtype] = {
    T.F32: np.dtype("<f4"),
    T.F16: np.dtype("<f2"),
    T.BF16: np.dtype("<u2"),
    T.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    T.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)]),
    T.Q5_0: np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    T.Q5_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)]),
    T.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
    T.Q2_K: np.dtype([("scales", "u1", QK_K // 16), ("qs", "u1", QK_K // 4), ("d", "<f2"), ("dmin", "<f2")]),
    T.Q3_K: np.dtype(
        [("hmask", "u1", QK_K // 8), ("qs", "u1", QK_K // 4), ("scales", "u1", 12), ("d", "<f2")]
    ),
    T.Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", QK_K // 2)]),
    T.Q5_K: np.dtype(
        [
            ("d", "<f2"),
            ("dmin", "<f2"),
            ("scales", "u1", 12),
            ("qh", "u1", QK_K // 8),
            ("qs", "u1", QK_K // 2),
        ]
    ),
    T.Q6_K: np.dtype(
        [("ql", "u1", QK_K // 2), ("qh", "u1", QK_K // 4), ("scales", "i1", QK_K // 16), ("d", "<f2")]
    ),
    # The i-quants, MXFP4 and the ternary types (ggml-common.h's block_iq2_xxs, ...): field names as ggml's.
    T.IQ4_NL: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    T.IQ4_XS: np.dtype(
        [("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", QK_K // 64), ("qs", "u1", QK_K // 2)]
    ),
    T.MXFP4: np.dtype([("e", "u1"), ("qs", "u1", 16)]),  # e: E8M0 exponent, no f16 field
    T.IQ2_XXS: np.dtype([("d", "<f2"), ("qs", "<u2", QK_K // 8)]),
    T.IQ2_XS: np.dtype([("d", "<f2"), ("qs", "<u2", QK_K // 8), ("scales", "u1", QK_K // 32)]),
    T.IQ2_S: np.dtype(
        [
            ("d", "<f2"),
            ("qs", "u1", QK_K // 8),
            ("signs", "u1", QK_K // 8),
            ("qh", "u1", QK_K // 32),
            ("scales", "u1", QK_K // 32),
        ]
    ),
    T.IQ3_XXS: np.dtype([("d", "<f2"), ("qs", "u1", QK_K // 4), ("scales_signs", "<u4", QK_K // 32)]),
    T.IQ3_S: np.dtype(
        [
            ("d", "<f2"),
            ("qs", "u1", QK_K // 4),
            ("qh", "u1", QK_K // 32),
            ("signs", "u1", QK_K // 8),
            ("scales", "u1", QK_K // 64),
        ]
    ),
    T.IQ1_S: np.dtype([("d", "<f2"), ("qs", "u1", QK_K // 8), ("qh", "<u2", QK_K // 32)]),
    # IQ1_M's f16 super-scale is split over the top nibbles of its four scales words
    T.IQ1_M: np.dtype([("qs", "u1", QK_K // 8), ("qh", "u1", QK_K // 16), ("scales", "<u2", QK_K // 64)]),
    T.TQ1_0: np.dtype([("qs", "u1", (QK_K - 4 * QK_K // 64) // 5), ("qh", "u1", QK_K // 64), ("d", "<f2")]),
    T.TQ2_0: np.dtype([("qs", "u1", QK_K // 4), ("d", "<f2")]),
}

for _qtype, _dtype in BLOCK_DTYPES.items():
    assert _dtype.itemsize == GGML_QUANT_SIZES[_qtype][1], (_qtype.name, _dtype.itemsize)


def view_blocks(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """View raw uint8 rows (N, row_bytes) as structured blocks (N, row_bytes // type_size)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return raw.view(BLOCK_DTYPES[qtype])
