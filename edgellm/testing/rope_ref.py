"""llama.cpp's rope in ggml's float32 arithmetic, element by element: the reference of the rope tests of
the rope op and of the CPU elementwise kernels; and the exact-angle rotation in float64, the reference of
the CUDA kernel (tests/cuda/)."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

from edgellm.gguf.rope import RopeParams

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))  # cosf / sinf / powf, as ggml calls them
for _f, _n in (("cosf", 1), ("sinf", 1), ("powf", 2)):
    getattr(_LIBM, _f).restype = ctypes.c_float
    getattr(_LIBM, _f).argtypes = [ctypes.c_float] * _n


def _fma32(a, b, c) -> np.float32:  # noqa: ANN001
    """a * b + c rounded once to float32 (the product is exact in float64)."""
    return np.float32(np.float64(np.float32(a)) * np.float64(np.float32(b)) + np.float64(np.float32(c)))


def ggml_rope_ref(x, pos, rope: RopeParams) -> np.ndarray:  # noqa: ANN001
    """llama.cpp's rope (ggml-cpu ggml_rope_cache_init / rope_yarn / rotate_pairs, ggml.c
    ggml_rope_yarn_corr_dims) written out per element in ggml's float32 arithmetic, the loop structure as
    ggml's: theta_scale = powf(base, -2.0f / n_dims), theta starting at (float)p and multiplied by it pair
    after pair (so theta carries the products' rounding: ~1e-4 rad at p ~ 1,000), cosf / sinf, and the
    fused multiply-adds GCC forms in `a*b + c*d` (the first product fused: fma(a, b, c*d))."""
    f32 = np.float32
    n_dims = rope.n_rot
    theta_scale = f32(_LIBM.powf(f32(rope.base), f32(-2.0) / f32(n_dims)))

    def corr_dim(beta: float) -> float:
        return n_dims * math.log(rope.n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(rope.base))

    if rope.ext_factor != 0.0:
        low = max(0.0, math.floor(corr_dim(rope.beta_fast)))
        high = min(n_dims - 1.0, math.ceil(corr_dim(rope.beta_slow)))
    mscale = f32(rope.mscale)  # its float32 formula: test_yarn_parameters_from_metadata
    out = np.asarray(x, np.float32).copy()
    for t, p in enumerate(pos):
        theta = f32(p)
        for i0 in range(0, n_dims, 2):
            ff = f32(rope.freq_factors[i0 // 2]) if rope.freq_factors else f32(1.0)
            theta_extrap = f32(theta / ff)
            theta_interp = f32(f32(rope.freq_scale) * theta_extrap)
            th = theta_interp
            if rope.ext_factor != 0.0:
                y = f32(i0 // 2 - low) / f32(max(0.001, high - low))
                ramp_mix = f32(f32(1) - min(f32(1), max(f32(0), y))) * f32(rope.ext_factor)
                th = _fma32(theta_interp, f32(1) - ramp_mix, f32(theta_extrap * ramp_mix))
            c, s = f32(f32(_LIBM.cosf(th)) * mscale), f32(f32(_LIBM.sinf(th)) * mscale)
            a, b = (i0 // 2, i0 // 2 + n_dims // 2) if rope.neox else (i0, i0 + 1)
            for h in range(out.shape[1]):
                x0, x1 = out[t, h, a], out[t, h, b]
                out[t, h, a] = _fma32(x0, c, -f32(x1 * s))
                out[t, h, b] = _fma32(x0, s, f32(x1 * c))
            theta = f32(theta * theta_scale)
    return out


def scaled_rope(d: int) -> RopeParams:
    """YaRN with llama3 frequency factors and an attention factor (every term of the rotation)."""
    factors = tuple(float(f) for f in np.geomspace(1.0, 16.0, d // 2))
    return RopeParams(
        n_rot=d, neox=False, base=5e5, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=256,
        freq_factors=factors,
    )  # fmt: skip


def rope_exact(k: np.ndarray, pos: np.ndarray, rope: RopeParams) -> np.ndarray:
    """The CUDA kernel's rotation in float64 (ops.rope_pair): theta = pos * RopeParams.inv_freq, cos and
    sin times mscale; neox pairs (i, i + n_rot/2), otherwise (2i, 2i+1)."""
    half = rope.n_rot // 2
    theta = pos.astype(np.float64)[:, None, None] * rope.inv_freq()[None, None, :]  # [T, 1, half]
    c, s = np.cos(theta) * rope.mscale, np.sin(theta) * rope.mscale
    out = k.astype(np.float64)
    a = np.arange(half) if rope.neox else 2 * np.arange(half)
    b = a + half if rope.neox else a + 1
    x0, x1 = out[..., a].copy(), out[..., b].copy()
    out[..., a], out[..., b] = x0 * c - x1 * s, x0 * s + x1 * c
    return out
