"""Float64 references and random inputs shared by the kernel tests of every backend (tests of the CPU ops,
the VNNI kernels and the CUDA kernels compare against the same references and error limits)."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm.quants import BLOCK_DTYPES, QUANT_TRAITS, get_traits
from edgellm.testing.encode import scale_fields

FLOAT_TYPES = (T.F32, T.F16, T.BF16)


NMSE_LIMIT = {qtype: (1e-10 if qtype in FLOAT_TYPES else 2e-4) for qtype in QUANT_TRAITS}


def random_raw(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw GGUF bytes that decode to finite weights: random quant bits, sane f16 scales."""
    traits = get_traits(qtype)
    if qtype in FLOAT_TYPES:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        if qtype == T.F16:
            return w.astype(np.float16).view(np.uint8)
        if qtype == T.BF16:
            return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return w.view(np.uint8)
    raw = rng.integers(0, 256, (rows, traits.row_bytes(cols)), dtype=np.uint8)
    blocks = raw.view(BLOCK_DTYPES[qtype])
    for field in scale_fields(qtype):
        field.set(blocks, rng.uniform(-0.05, 0.05, blocks.shape))
    return raw


def reference_weight(qtype: T, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return get_traits(qtype).dequantize_ref(raw).reshape(rows, cols).astype(np.float64)


def nmse(y: np.ndarray, ref: np.ndarray) -> float:
    return float(((y.astype(np.float64) - ref) ** 2).sum() / (ref**2).sum())


# ---- LayerNorm and GELU (StarCoder 2, GPT-2) ------------------------------------------------------------
def layernorm_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * w + b per row, in float64."""
    x = x.astype(np.float64)
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c**2).mean(-1, keepdims=True) + eps) * w + b


def _gelu_f16_table() -> np.ndarray:
    """ggml's ggml_table_gelu_f16: for each of the 65,536 f16 values v, the f16 of the float32 tanh form
    0.5 v (1 + tanh(sqrt(2/pi) v (1 + 0.044715 v^2))) (vec.h ggml_gelu_f32) as llama.cpp's build computes
    it: C's tanhf (numpy's float32 tanh differs from it in the last bit) and 1 + a v^2 one fused
    multiply-add (float64, exact here), which reproduces the table llama-cpp-python 0.3.36 ships bit for
    bit (without the FMA one entry, -1.999, differs)."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.tanhf.restype, libm.tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
    v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    v = np.where(np.isfinite(v), v, np.float32(0))  # inf / NaN entries are never read (|x| >= 10 cut-offs)
    c, a, half, one = (np.float32(k) for k in (0.79788456080286535587989211986876, 0.044715, 0.5, 1.0))
    fused = ((a * v).astype(np.float64) * v + 1.0).astype(np.float32)
    tanh = np.array([libm.tanhf(float(z)) for z in c * v * fused], np.float32)
    return (half * v * (one + tanh)).astype(np.float16).astype(np.float32)


GELU_TABLE = _gelu_f16_table()


def gelu_ref(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16 (always defined): 0 at x <= -10, x at x >= 10, else the table
    entry of x rounded to f16."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, GELU_TABLE[bits])).astype(np.float32)


# Values where the table's edges and f16's rounding matter: the +-10 cut-offs, f16 subnormals and
# overflow, signed zeros, ties between two f16 values, and -1.9990234375, the one entry where the table
# needs the FMA in 1 + a x^2.
GELU_SPECIAL = [-10.0, 10.0, -10.000001, 9.999999, -9.99, 0.0, -0.0, 1e-7, -3e-6, 5e-5, 65519.0, -65519.0,
                1e30, -1e30, 1.0 + 2.0**-11, -2.5 - 2.0**-10, -1.9990234375, 3.0]  # fmt: skip
