"""SwiGLU as llama.cpp computes it on AVX-512 hosts (ggml_vec_swiglu_f32 with ggml_v_silu / ggml_v_expf),
on every CPU tier with tile primitives.

ggml evaluates silu(x) = x / (1 + exp(-x)) 16 floats at a time with its own exp (an ARM optimized-routines
polynomial: fused multiply-adds and a vscalefps), and only the n % 16 leftovers with libm's expf. Writing
the same operations in LLVM IR (llvm.fma and the avx512 scalef intrinsic, no fast-math flags) gives the
same bits as llama.cpp on the same CPU, and is ~5x faster than a libm expf per element (Numba has no
vector exp without Intel's SVML). The tiers without AVX-512 compute vscalefps's j * 2^n exactly with two
power-of-two multiplies (tier_ir.scale2n_generic), so every tier gives the AVX-512 bits (llama.cpp's own
AVX2 builds use another exp polynomial). The portable tier uses ops.swiglu_cpu with libm's expf.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange

from edgellm.backends.cpu.ir_util import declare, switch_intrinsic
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.tier_ir import V16I32
from edgellm.backends.cpu.tiers import TileOps, compiled_tiers

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, 16)
_FMA = "llvm.fma.v16f32"


def _const(v: float) -> ir.Constant:
    return ir.Constant(_VF, [float(np.float32(v))] * 16)


def _v_expf(b: ir.IRBuilder, module: ir.Module, x: ir.Value, ops: TileOps) -> ir.Value:
    """ggml_v_expf (AVX-512 form), operation for operation (the tier's scale2n for vscalefps)."""
    fma = declare(module, _FMA, _VF, [_VF] * 3)
    r = _const(float.fromhex("0x1.8p23"))
    z = b.call(fma, [x, _const(float.fromhex("0x1.715476p+0")), r])
    n = b.fsub(z, r)
    neg_n = b.fneg(n)
    t = b.call(fma, [neg_n, _const(float.fromhex("0x1.62e4p-1")), x])  # fnmadd(n, c, x) = -n*c + x
    bb = b.call(fma, [neg_n, _const(float.fromhex("0x1.7f7d1cp-20")), t])
    u = b.fmul(bb, bb)
    p3 = b.call(fma, [_const(float.fromhex("0x1.0e4020p-7")), bb, _const(float.fromhex("0x1.573e2ep-5"))])
    p2 = b.call(fma, [_const(float.fromhex("0x1.555e66p-3")), bb, _const(float.fromhex("0x1.fffdb6p-2"))])
    p1 = b.call(fma, [_const(float.fromhex("0x1.ffffecp-1")), bb, _const(1.0)])
    j = b.call(fma, [b.call(fma, [p3, u, p2]), u, p1])
    n_int = b.sub(b.bitcast(z, V16I32), b.bitcast(r, V16I32))  # n as an integer while |n| <= 192
    res = ops.scale2n(b, j, n, n_int)
    # |n| > 192: exp over/underflows; ggml blends inf (n > 0) or 0 (n <= 0)
    absn = b.call(declare(module, "llvm.fabs.v16f32", _VF, [_VF]), [n])
    big = b.fcmp_ordered(">", absn, _const(192.0))
    alt = b.select(b.fcmp_ordered("<=", n, _const(0.0)), _const(0.0), _const(float("inf")))
    return b.select(big, alt, res)


def _build(module: ir.Module, name: str, ops: TileOps) -> ir.Function:
    """void name(gate, up, out, n_vec): out[i] = silu(gate[i]) * up[i] for 16 * n_vec floats."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 4), name)
    fn.linkage = "internal"
    g_a, u_a, o_a, n_vec = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    vp = _VF.as_pointer()
    g_p, u_p, o_p = (b.inttoptr(a, vp) for a in (g_a, u_a, o_a))
    b.cbranch(b.icmp_signed(">", n_vec, ir.Constant(_I64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    x = b.load(b.gep(g_p, [i]), align=4)
    e = _v_expf(b, module, b.fsub(_const(0.0), x), ops)  # ggml_v_silu: exp(0 - x)
    silu = b.fdiv(x, b.fadd(_const(1.0), e))
    b.store(b.fmul(silu, b.load(b.gep(u_p, [i]), align=4)), b.gep(o_p, [i]), align=4)
    i_next = b.add(i, ir.Constant(_I64, 1))
    i.add_incoming(i_next, loop)
    b.cbranch(b.icmp_signed("<", i_next, n_vec), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return fn


# _swiglu16(tier, gate, up, out, n_vec): one IR variant per compiled tier (CpuTier.index)
_swiglu16 = switch_intrinsic(
    {
        t.index: (f"edgellm_swiglu16_{t.name}", lambda m, n, ops=t.tiles: _build(m, n, ops))
        for t in compiled_tiers()
    },
    4,
)


@njit(cache=True, nogil=True, inline="always")
def _swiglu_row(gate_up: np.ndarray, out: np.ndarray, t: int, tier: int) -> None:
    ff = out.shape[1]
    n_vec = ff // 16
    base = gate_up.ctypes.data + t * gate_up.strides[0]
    _swiglu16(tier, base, base + ff * 4, out.ctypes.data + t * out.strides[0], n_vec)
    for i in range(n_vec * 16, ff):  # ggml's scalar leftovers: libm expf
        g = gate_up[t, i]
        out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, ff + i]


@njit(cache=True, nogil=True)
def swiglu_vec_cpu(gate_up: np.ndarray, out: np.ndarray, tier: int) -> None:
    """out[t] = silu(gate) * up for gate_up = [gate | up] rows ([T, 2*ff] -> [T, ff], rows contiguous),
    with the IR of compiled tier `tier` (a CpuTier.index; the caller checks)."""
    for t in range(out.shape[0]):
        _swiglu_row(gate_up, out, t, tier)


@njit(cache=True, nogil=True, parallel=True)
def swiglu_vec_par_cpu(gate_up: np.ndarray, out: np.ndarray, tier: int) -> None:
    for t in prange(out.shape[0]):
        _swiglu_row(gate_up, out, t, tier)


follow_sources(swiglu_vec_cpu, swiglu_vec_par_cpu)  # their code holds tier_ir's IR
