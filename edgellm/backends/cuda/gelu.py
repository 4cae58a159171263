"""ggml's float32 GELU on the GPU: the f16-rounded input and result of its table (cpu/layernorm_gelu.py
explains it), computed per element, for GELU (layernorm_gelu.py) and GeGLU (ops.py)."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import SIMULATOR, f16_round, mul_rn

if SIMULATOR:

    def fma_rn(a, b, c):  # noqa: ANN001, ANN202 - simulator stand-in for libdevice's fmaf
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))

else:  # pragma: no cover - needs a GPU
    from numba.cuda.libdevice import fmaf as fma_rn

GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


@cuda.jit(device=True, inline=True)
def gelu_f16_table(x):  # noqa: ANN001, ANN201
    """0 at x <= -10, x at x >= 10, else the table's value at x's f16 rounding."""
    if x <= np.float32(-10.0):
        return np.float32(0.0)
    if x >= np.float32(10.0):
        return x
    v = f16_round(x)
    inner = mul_rn(mul_rn(SQRT_2_OVER_PI, v), fma_rn(mul_rn(GELU_COEF_A, v), v, np.float32(1.0)))
    return f16_round(mul_rn(mul_rn(np.float32(0.5), v), np.float32(1.0) + math.tanh(inner)))
