"""Reference (numpy) activation quantization, as llama.cpp quantizes the activation row for each weight
type's dot product (its `vec_dot_type`). The Numba kernel `quantize_act_cpu` must match it exactly."""

from __future__ import annotations

import numpy as np


def quantize_act_ref(x: np.ndarray, group: int, vec_dot: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x f32 [M, K] -> (xq int8 [M, K], xs f32 [M, K//group], xsum f32 [M, K//group]).

    q8_0 / q8_1: blocks of 32, d = amax/127 stored as f16, q = round-half-even(x * (127/amax)); q8_1 also
    stores s = f16(d * sum(q)). q8_K: blocks of 256, iscale = -127/max (max: signed value of largest
    magnitude), q = min(127, round-half-even(iscale * x)), d = 1/iscale in f32. Scales and sums are then
    expressed per weight group (xsum = scale * sum of the group's q, f16-rounded for q8_1)."""
    x = np.asarray(x, dtype=np.float32)
    m_rows, k_cols = x.shape
    block = 256 if vec_dot == "q8_K" else 32
    xb = x.reshape(m_rows, k_cols // block, block)
    amax = np.abs(xb).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if vec_dot == "q8_K":
            pick = np.take_along_axis(xb, np.abs(xb).argmax(axis=-1)[..., None], axis=-1)[..., 0]
            iscale = np.where(amax > 0, np.float32(-127.0) / pick, 0).astype(np.float32)
            d = np.where(amax > 0, np.float32(1.0) / iscale, 0).astype(np.float32)
            d_stored = d
        else:
            iscale = np.where(amax > 0, np.float32(127.0) / amax, 0).astype(np.float32)
            d = (amax / np.float32(127.0)).astype(np.float32)
            d_stored = d.astype(np.float16).astype(np.float32)
    xq = np.minimum(np.rint(xb * iscale[..., None]), 127).astype(np.int8).reshape(m_rows, k_cols)
    per = block // group
    isum = xq.reshape(m_rows, k_cols // group, group).astype(np.int32).sum(axis=-1).astype(np.float32)
    xs = np.repeat(d_stored, per, axis=1)
    if vec_dot == "q8_1":
        xsum = (np.repeat(d, per, axis=1) * isum).astype(np.float16).astype(np.float32)
    else:
        xsum = (xs * isum).astype(np.float32)
    return xq, xs, xsum
