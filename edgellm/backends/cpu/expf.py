"""The C library's expf, in a form LLVM vectorises: the softmax of attention at long contexts spent a
quarter of its time in one libm call per score.

llama.cpp's CPU attention calls expf, and a polynomial of its own (ggml_v_expf) flipped a teacher-forced
Gemma 3 token against it, so this is glibc's algorithm itself (ARM's optimized-routines expf, also
musl's): x * 32 / ln 2 = k + r, 2^(k/32) from a 32-entry table, a degree-3 polynomial in r, all in
float64, one rounding to float32 at the end. glibc selects a build compiled with FMA contraction on CPUs
with FMA (every one of its operations that can fuse does) and a plain one elsewhere; the two differ in
one float32 input below zero (found by comparing them over every one). `vector_expf_variant()` picks
whichever of the two gives the process's own expf bit for bit on a fixed sample (that input included),
or none (the scalar libm loop), so whatever the C library, results are the ones it gives.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

N = 32  # table entries (EXP2F_TABLE_BITS = 5)
# tab[i] = bits(2^(i/32)) - (i << 47): 2^(k/32) is then the double with bits tab[k % 32] + (k << 47)
EXP2_TABLE = np.array(
    [int(np.float64(2.0 ** (i / N)).view(np.uint64)) - (i << 47) for i in range(N)], np.uint64
)
INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * N
SHIFT = float.fromhex("0x1.8p+52")  # adding it rounds to an integer in the low bits
C0 = float.fromhex("0x1.c6af84b912394p-5") / N / N / N
C1 = float.fromhex("0x1.ebfce50fac4f3p-3") / N / N
C2 = float.fromhex("0x1.62e42ff0c52d6p-1") / N
UNDERFLOW = np.float32(float.fromhex("-0x1.9fe368p6"))  # below: 0 (log of 2^-150)
# the one float32 in [-104, 0] where the FMA and the plain build give different bits (the sample's first)
DISCRIMINATING = np.uint32(0xC27C65D9)  # -63.099...: 0x1.f8cbb2p5
FMA, PLAIN, LIBM = 0, 1, 2  # variants


@intrinsic
def _fma(typingctx, a, b, c):  # noqa: ANN001, ANN201
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def _f64_bits(typingctx, x):  # noqa: ANN001, ANN201
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.uint64))

    return sig, codegen


@intrinsic
def _bits_f64(typingctx, b):  # noqa: ANN001, ANN201
    sig = types.float64(types.uint64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return sig, codegen


# No fast-math anywhere below: (x + SHIFT) - SHIFT is the rounding, which reassociation would remove.
@njit(cache=True, nogil=True, inline="always")
def _expf_fma(x: np.float32, tab: np.ndarray) -> np.float32:
    xd = np.float64(x)
    kd = _fma(INV_LN2_N, xd, SHIFT)
    ki = _f64_bits(kd)
    kd = kd - SHIFT
    r = _fma(INV_LN2_N, xd, -kd)
    s = _bits_f64(tab[ki % np.uint64(N)] + (ki << np.uint64(52 - 5)))
    y = _fma(_fma(C0, r, C1), r * r, _fma(C2, r, 1.0)) * s
    return np.float32(0.0) if x < UNDERFLOW else np.float32(y)  # NaN: y, NaN


@njit(cache=True, nogil=True, inline="always")
def _expf_plain(x: np.float32, tab: np.ndarray) -> np.float32:
    xd = np.float64(x)
    z = INV_LN2_N * xd
    kd = z + SHIFT
    ki = _f64_bits(kd)
    kd = kd - SHIFT
    r = z - kd
    s = _bits_f64(tab[ki % np.uint64(N)] + (ki << np.uint64(52 - 5)))
    y = ((C0 * r + C1) * (r * r) + (C2 * r + 1.0)) * s
    return np.float32(0.0) if x < UNDERFLOW else np.float32(y)  # NaN: y, NaN


@njit(cache=True, nogil=True)
def exp_nonpositive_inplace(s: np.ndarray, variant: int, tab: np.ndarray) -> None:
    """s = expf(s) for s <= 0, -inf or NaN (a softmax's scores minus their max), with the C library's bits
    (module doc). variant: FMA, PLAIN or LIBM (np.exp, one libm call each)."""
    if variant == FMA:
        for j in range(s.shape[0]):
            s[j] = _expf_fma(s[j], tab)
    elif variant == PLAIN:
        for j in range(s.shape[0]):
            s[j] = _expf_plain(s[j], tab)
    else:
        for j in range(s.shape[0]):
            s[j] = np.exp(s[j])


def sample_inputs() -> np.ndarray:
    """float32 inputs the variant check compares: the discriminating one, 0, -inf, the underflow edge and
    65,536 spread over [-104, 0] by their bits."""
    bits = np.linspace(0x80000000, 0xC2D00000, 65536, dtype=np.uint64).astype(np.uint32)
    edge = np.array([UNDERFLOW, np.nextafter(UNDERFLOW, np.float32(0)), -np.inf, 0.0], np.float32)
    return np.concatenate([DISCRIMINATING[None].view(np.float32), edge, bits.view(np.float32)])


_variant: int | None = None


def vector_expf_variant() -> int:
    """FMA or PLAIN where that variant gives the process's expf bit for bit on sample_inputs(), else LIBM.
    Checked once per process."""
    global _variant
    if _variant is None:
        x = sample_inputs()
        ref = x.copy()
        exp_nonpositive_inplace(ref, LIBM, EXP2_TABLE)
        _variant = LIBM
        for v in (FMA, PLAIN):
            got = x.copy()
            exp_nonpositive_inplace(got, v, EXP2_TABLE)
            if np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
                _variant = v
                break
    return _variant
