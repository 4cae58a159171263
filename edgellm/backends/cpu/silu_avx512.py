"""SwiGLU as llama.cpp computes it on AVX-512 hosts: ggml_vec_swiglu_f32 with ggml_v_silu / ggml_v_expf.

ggml evaluates silu(x) = x / (1 + exp(-x)) 16 floats at a time with its own exp (an ARM optimized-routines
polynomial: fused multiply-adds and a vscalefps), and only the n % 16 leftovers with libm's expf. Writing
the same operations in LLVM IR (llvm.fma and the avx512 scalef intrinsic, no fast-math flags) gives the
same bits as llama.cpp on the same CPU, and is ~5x faster than a libm expf per element (Numba has no
vector exp without Intel's SVML). Only used where the host has AVX-512F (vnni.VNNI_ACTIVE implies it);
elsewhere ops.swiglu_cpu computes with libm's expf, as llama.cpp's own non-AVX-512 builds differ too.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from edgellm.backends.cpu.ir_util import declare

_I16, _I32, _I64, _F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, 16)
_SCALEF = "llvm.x86.avx512.mask.scalef.ps.512"
_FMA = "llvm.fma.v16f32"


def _const(v: float) -> ir.Constant:
    return ir.Constant(_VF, [float(np.float32(v))] * 16)


def _v_expf(b: ir.IRBuilder, module: ir.Module, x: ir.Value) -> ir.Value:
    """ggml_v_expf (AVX-512 form), operation for operation."""
    fma = declare(module, _FMA, _VF, [_VF] * 3)
    scalef = declare(module, _SCALEF, _VF, [_VF, _VF, _VF, _I16, _I32])
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
    res = b.call(scalef, [j, n, ir.Constant(_VF, ir.Undefined), ir.Constant(_I16, -1), ir.Constant(_I32, 4)])
    # |n| > 192: exp over/underflows; ggml blends inf (n > 0) or 0 (n <= 0)
    absn = b.call(declare(module, "llvm.fabs.v16f32", _VF, [_VF]), [n])
    big = b.fcmp_ordered(">", absn, _const(192.0))
    alt = b.select(b.fcmp_ordered("<=", n, _const(0.0)), _const(0.0), _const(float("inf")))
    return b.select(big, alt, res)


def _build(module: ir.Module, name: str) -> ir.Function:
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
    e = _v_expf(b, module, b.fsub(_const(0.0), x))  # ggml_v_silu: exp(0 - x)
    silu = b.fdiv(x, b.fadd(_const(1.0), e))
    b.store(b.fmul(silu, b.load(b.gep(u_p, [i]), align=4)), b.gep(o_p, [i]), align=4)
    i_next = b.add(i, ir.Constant(_I64, 1))
    i.add_incoming(i_next, loop)
    b.cbranch(b.icmp_signed("<", i_next, n_vec), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return fn


@intrinsic
def _swiglu16(typingctx, gate, up, out, n_vec):
    sig = types.void(types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        fn = builder.module.globals.get("edgellm_swiglu16")
        if fn is None:
            fn = _build(builder.module, "edgellm_swiglu16")
        builder.call(fn, args)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _swiglu_row(gate_up: np.ndarray, out: np.ndarray, t: int) -> None:
    ff = out.shape[1]
    n_vec = ff // 16
    base = gate_up.ctypes.data + t * gate_up.strides[0]
    _swiglu16(base, base + ff * 4, out.ctypes.data + t * out.strides[0], n_vec)
    for i in range(n_vec * 16, ff):  # ggml's scalar leftovers: libm expf
        g = gate_up[t, i]
        out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, ff + i]


@njit(cache=True, nogil=True)
def swiglu_avx512_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    """out[t] = silu(gate) * up for gate_up = [gate | up] rows ([T, 2*ff] -> [T, ff], rows contiguous)."""
    for t in range(out.shape[0]):
        _swiglu_row(gate_up, out, t)


@njit(cache=True, nogil=True, parallel=True)
def swiglu_avx512_par_cpu(gate_up: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        _swiglu_row(gate_up, out, t)
