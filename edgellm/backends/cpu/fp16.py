"""float16 rounding for the CPU kernels (Numba's CPU target has no float16 type)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def f16_round(x: float) -> np.float32:
    """x rounded to the nearest float16 value (ties to even), returned as float32.

    llama.cpp stores activation-quantization scales, the KV cache, and the attention operands in f16;
    doing the same roundings keeps our greedy tokens identical to its tokens."""
    ax = abs(x)
    if ax == 0.0 or ax != ax:
        return np.float32(x)
    if ax >= 65520.0:
        return np.float32(np.inf) if x > 0 else np.float32(-np.inf)
    _, e = math.frexp(ax)  # ax = m * 2^e, m in [0.5, 1)
    if e < -13:
        e = -13  # f16 subnormals: fixed step 2^-24
    step = math.ldexp(1.0, e - 11)
    return np.float32(np.rint(x / step) * step)
