"""float16 rounding for the CPU kernels (Numba's CPU target has no float16 type)."""

from __future__ import annotations

import math
import platform

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of a float32 as a uint32 (a scalar bitcast; Numba has no scalar view)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return sig, codegen


@intrinsic
def _bits_f32(typingctx, b):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


# x86 F16C (vcvtps2ph / vcvtph2ps): f32_to_f16_bits is only called where the host has it; elsewhere LLVM
# would lower the conversion to a runtime-library call Numba's JIT may not resolve.
HOST_F16C = bool(llb.get_host_cpu_features().get("f16c"))
# Where half <-> float conversions are instructions LLVM can emit inline: x86 with F16C, and ARM64 (native
# fcvt). The attention IR widens f16 K/V with them; elsewhere attention uses its Numba loops.
HALF_OPS_NATIVE = HOST_F16C or platform.machine().lower() in ("aarch64", "arm64")


@intrinsic
def f32_to_f16_bits(typingctx, x):
    """The f16 bits of a float32, rounded to nearest even (fptrunc: vcvtps2ph with F16C)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@njit(cache=True, inline="always")
def f16_round(x: float) -> np.float32:
    """x rounded to the nearest float16 value (ties to even), returned as float32.

    llama.cpp stores activation-quantization scales, the KV cache, and the attention operands in f16;
    doing the same roundings keeps our greedy tokens identical to its tokens. The normal f16 range is
    rounded with integer ops on the f32 bits (it runs per activation block: frexp/ldexp calls cost
    ~10x more); zero, subnormals and overflow take the general path."""
    b = _f32_bits(np.float32(x))
    e = (b >> np.uint32(23)) & np.uint32(0xFF)
    if e >= np.uint32(113) and e < np.uint32(142):  # 2^-14 <= |x| < 2^15: the result is a normal f16
        return _bits_f32(
            (b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        )
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


@njit(cache=True, nogil=True)
def f16_round_inplace(a: np.ndarray) -> None:
    """Round a contiguous float32 vector to float16 values in place (ties to even), with integer ops on
    the bits for the normal f16 range (vectorises) and f16_round for zero, subnormals and overflow."""
    bits = a.view(np.uint32)
    for i in range(a.shape[0]):
        b = bits[i]
        e = (b >> np.uint32(23)) & np.uint32(0xFF)
        if e >= np.uint32(113) and e < np.uint32(142):  # 2^-14 <= |x| < 2^15: result is a normal f16
            bits[i] = (b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        else:
            a[i] = f16_round(a[i])


@njit(cache=True, nogil=True, inline="always")
def f16_bits_to_f32(h: np.uint16) -> np.float32:
    """The float32 value of f16 bits (every case: zero, subnormal, normal, inf, NaN)."""
    hv = np.int64(h)
    sign = np.float32(-1.0) if hv & 0x8000 else np.float32(1.0)
    e = (hv >> 10) & 0x1F
    m = hv & 0x3FF
    if e == 0:
        return sign * np.float32(m) * np.float32(2.0**-24)
    if e == 31:
        return sign * np.float32(np.inf) if m == 0 else np.float32(np.nan)
    return sign * np.float32(1024 + m) * np.float32(2.0 ** (e - 25))


@njit(cache=True, nogil=True, inline="always")
def f16_bits(x: float) -> np.uint16:
    """The f16 bits of a float32, rounded to nearest even, on any host (f16_round, then the fields): for
    a few values per call (q8_0 scales), where F16C's vcvtps2ph is not guaranteed."""
    r = f16_round(x)
    b = _f32_bits(r)
    sign = np.uint16((b >> np.uint32(16)) & np.uint32(0x8000))
    a = abs(r)
    if a != a:
        return sign | np.uint16(0x7E00)
    if a == np.inf:
        return sign | np.uint16(0x7C00)
    if a < np.float32(2.0**-14):  # zero or an f16 subnormal: an integer multiple of 2^-24
        return sign | np.uint16(a * np.float32(2.0**24))
    e = ((b >> np.uint32(23)) & np.uint32(0xFF)) - np.uint32(112)  # rebias 127 -> 15
    return sign | np.uint16((e << np.uint32(10)) | ((b >> np.uint32(13)) & np.uint32(0x3FF)))


# f32 -> f16 bits for kernels every host runs (the GELU table's index): the conversion instruction where
# LLVM emits one inline, else f16_bits' integer form (the same bits for every value but NaN payloads)
f32_to_f16_bits_any = f32_to_f16_bits if HALF_OPS_NATIVE else f16_bits
