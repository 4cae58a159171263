"""AVX-512 VNNI (`vpdpbusd`) integer group sums for the dequant-matmul kernels (x86 with avx512vnni only).

LLVM never emits `vpdpbusd` by itself (int8 loops become `vpmaddwd`), so the integer part is written in
LLVM IR through a Numba `@intrinsic`: for a tile of 4 weight rows and one int8 activation row it computes the
exact int32 group sums isum[g, r] = sum_k x[g*G + k] * w[r, g*G + k]. The float part (scales, mins, the
ordered sum over groups) stays in Numba code with the same expressions, in the same order, as
matmul._row_dot, so the results are bit-identical to the portable kernels' (integer sums are exact).

`vpdpbusd` multiplies unsigned by signed bytes. The activations (int8 in [-127, 127]) become unsigned by
xor 0x80 (= x + 128) and the excess 128 * sum(w) over each 4-byte lane is removed by a second `vpdpbusd` of
the weights with a vector of 128s: dot(x + 128, w) - dot(128, w) = dot(x, w), exact for any int8 weight
(-128 included). Then 16 int32 lanes per 64-byte chunk are folded per group (8 lanes for G=32, 4 for G=16)
with a transpose-and-add network over the 4 rows, and stored as isum[g, r] (4 int32 per group).

Only compiled when first called, and only called when the host has the feature (VNNI_ACTIVE), so CPUs
without it (AVX2-only x86, ARM) never see the x86 intrinsic. EDGELLM_NO_VNNI=1 forces the portable path.
"""

from __future__ import annotations

import os

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

ORDERED_MATH = {"nsz", "arcp", "afn"}  # as matmul.ORDERED_MATH (copied: no import cycle)
U = np.uint64
CHUNK = 64  # bytes per zmm
TILE_ROWS = 4  # weight rows per integer tile


def _host_has_vnni() -> bool:
    features = llb.get_host_cpu_features()
    return bool(features.get("avx512vnni") and features.get("avx512bw") and features.get("avx512f"))


VNNI_ACTIVE = _host_has_vnni() and os.environ.get("EDGELLM_NO_VNNI", "") in ("", "0")

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V64I8 = ir.VectorType(_I8, 64)
_V16I32 = ir.VectorType(_I32, 16)
_DPBUSD = "llvm.x86.avx512.vpdpbusd.512"


def _comb(b: ir.IRBuilder, lo_src: ir.Value, hi_src: ir.Value) -> ir.Value:
    """Pairwise fold of two 16-lane vectors: lane i<8 = A[2i]+A[2i+1], lane 8+i = B[2i]+B[2i+1]."""
    evens = ir.Constant(_V16I32, list(range(0, 32, 2)))
    odds = ir.Constant(_V16I32, list(range(1, 32, 2)))
    return b.add(b.shuffle_vector(lo_src, hi_src, evens), b.shuffle_vector(lo_src, hi_src, odds))


def _chunk_quads(b: ir.IRBuilder, dp: ir.Function, x_u: ir.Value, w_ptrs: list[ir.Value], off: ir.Value):
    """E[4r + j] = sum of x*w over bytes 16j..16j+15 of weight row r's 64-byte chunk at byte offset off."""
    c128 = ir.Constant(_V16I32, [0x80808080] * 16)
    zero = ir.Constant(_V16I32, [0] * 16)
    d = []
    for wp in w_ptrs:
        p = b.bitcast(b.gep(wp, [off]), _V64I8.as_pointer())
        w = b.bitcast(b.load(p, align=1), _V16I32)
        d.append(b.sub(b.call(dp, [zero, x_u, w]), b.call(dp, [zero, c128, w])))
    return _comb(b, _comb(b, d[0], d[1]), _comb(b, d[2], d[3]))


def _load_x_unsigned(b: ir.IRBuilder, x_ptr: ir.Value, off: ir.Value) -> ir.Value:
    p = b.bitcast(b.gep(x_ptr, [off]), _V64I8.as_pointer())
    xv = b.load(p, align=1)
    return b.bitcast(b.xor(xv, ir.Constant(_V64I8, [0x80] * 64)), _V16I32)


def _store(b: ir.IRBuilder, out_ptr: ir.Value, lane_off: ir.Value, v: ir.Value) -> None:
    p = b.bitcast(b.gep(out_ptr, [lane_off]), _V16I32.as_pointer())
    b.store(v, p, align=4)


def _build_isum_fn(module: ir.Module, name: str, group: int) -> ir.Function:
    """void name(i64 x_addr, i64 w_addr, i64 w_stride, i64 n_chunks, i64 out_addr): see module docstring.
    out receives 16 int32 per 64 bytes (G=16) or per 128 bytes (G=32, the last pair padded with a zero chunk),
    so it must hold ceil(n_chunks * 64 / G / 4) * 16 int32."""
    dp = module.globals.get(_DPBUSD)
    if dp is None:
        dp = ir.Function(module, ir.FunctionType(_V16I32, [_V16I32] * 3), _DPBUSD)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 5), name)
    fn.linkage = "internal"
    x_addr, w_addr, w_stride, n_chunks, out_addr = fn.args
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    tail = fn.append_basic_block("tail")
    tail_body = fn.append_basic_block("tail_body")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    x_ptr = b.inttoptr(x_addr, _I8.as_pointer())
    w0 = b.inttoptr(w_addr, _I8.as_pointer())
    w_ptrs = [w0] + [b.gep(w0, [b.mul(w_stride, ir.Constant(_I64, r))]) for r in range(1, TILE_ROWS)]
    out_ptr = b.inttoptr(out_addr, _I32.as_pointer())
    step = 2 if group == 32 else 1  # chunks per stored 16-lane vector
    n_iter = b.udiv(n_chunks, ir.Constant(_I64, step))
    b.cbranch(b.icmp_unsigned("==", n_iter, ir.Constant(_I64, 0)), tail, loop)

    b.position_at_end(loop)
    i = b.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    off = b.mul(i, ir.Constant(_I64, CHUNK * step))
    if group == 16:
        # quads are the groups: out lane 4j + r = E[4r + j]
        e = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
        res = b.shuffle_vector(e, e, ir.Constant(_V16I32, [4 * (lane % 4) + lane // 4 for lane in range(16)]))
    else:
        off_b = b.add(off, ir.Constant(_I64, CHUNK))
        ea = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
        eb = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off_b), w_ptrs, off_b)
        res = _pair_groups(b, _comb(b, ea, eb))
    _store(b, out_ptr, b.mul(i, ir.Constant(_I64, 16)), res)
    i_next = b.add(i, ir.Constant(_I64, 1))
    i.add_incoming(i_next, loop)
    b.cbranch(b.icmp_unsigned("<", i_next, n_iter), loop, tail)

    b.position_at_end(tail)  # G=32 with an odd chunk count: the last chunk pairs with zeros
    odd = b.icmp_unsigned("!=", b.urem(n_chunks, ir.Constant(_I64, step)), ir.Constant(_I64, 0))
    b.cbranch(odd, tail_body, done)
    b.position_at_end(tail_body)
    off = b.mul(n_iter, ir.Constant(_I64, CHUNK * step))
    ea = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
    res = _pair_groups(b, _comb(b, ea, ir.Constant(_V16I32, [0] * 16)))
    _store(b, out_ptr, b.mul(n_iter, ir.Constant(_I64, 16)), res)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _pair_groups(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """F[2r + h] (chunk a) and F[8 + 2r + h] (chunk b) -> out lane 4*gl + r, gl = h (a) or 2 + h (b)."""
    src = []
    for lane in range(16):
        gl, r = lane // 4, lane % 4
        src.append(2 * r + gl if gl < 2 else 8 + 2 * r + gl - 2)
    return b.shuffle_vector(f, f, ir.Constant(_V16I32, src))


def _make_intrinsic(group: int):
    name = f"edgellm_vnni_isum4_g{group}"

    @intrinsic
    def isum_tile(typingctx, x_addr, w_addr, w_stride, n_chunks, out_addr):
        sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            module = builder.module
            fn = module.globals.get(name)
            if fn is None:
                fn = _build_isum_fn(module, name, group)
            builder.call(fn, args)
            return context.get_dummy_value()

        return sig, codegen

    return isum_tile


_isum_tile_g32 = _make_intrinsic(32)
_isum_tile_g16 = _make_intrinsic(16)


@njit(cache=True, nogil=True, inline="always")
def _isum_tile(x_addr, w_addr, w_stride, n_chunks, out_addr, group) -> None:
    if group == 32:
        _isum_tile_g32(x_addr, w_addr, w_stride, n_chunks, out_addr)
    else:
        _isum_tile_g16(x_addr, w_addr, w_stride, n_chunks, out_addr)


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _group_dot_2d(xq, m, q, n, base, g_u) -> np.int32:
    """Portable group sum for the groups past the last full 64-byte chunk (matmul._group_dot's loop)."""
    acc = np.int32(0)
    for k in range(U(0), g_u):
        acc += np.int32(xq[m, base + k]) * np.int32(q[n, base + k])
    return acc


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _tile_outputs(isum, n_vgroups, xq, xs, xsum, m, q, scale, minv, has_min, n, n_groups, g_u, out) -> None:
    """out[m, n:n+4] from the tile's integer sums: per row exactly matmul._row_dot's float expression and
    group order (the VNNI groups first, then the portable tail groups, which come last in k)."""
    a0 = a1 = a2 = a3 = np.float32(0.0)
    c0 = c1 = c2 = c3 = np.float32(0.0)
    for g in range(n_vgroups):
        xg = xs[m, g]
        a0 += (xg * scale[n, g]) * np.float32(isum[4 * g])
        a1 += (xg * scale[n + 1, g]) * np.float32(isum[4 * g + 1])
        a2 += (xg * scale[n + 2, g]) * np.float32(isum[4 * g + 2])
        a3 += (xg * scale[n + 3, g]) * np.float32(isum[4 * g + 3])
        if has_min:
            xm = xsum[m, g]
            c0 += minv[n, g] * xm
            c1 += minv[n + 1, g] * xm
            c2 += minv[n + 2, g] * xm
            c3 += minv[n + 3, g] * xm
    for g in range(n_vgroups, n_groups):
        base = U(g) * g_u
        xg = xs[m, g]
        a0 += (xg * scale[n, g]) * np.float32(_group_dot_2d(xq, m, q, n, base, g_u))
        a1 += (xg * scale[n + 1, g]) * np.float32(_group_dot_2d(xq, m, q, n + 1, base, g_u))
        a2 += (xg * scale[n + 2, g]) * np.float32(_group_dot_2d(xq, m, q, n + 2, base, g_u))
        a3 += (xg * scale[n + 3, g]) * np.float32(_group_dot_2d(xq, m, q, n + 3, base, g_u))
        if has_min:
            xm = xsum[m, g]
            c0 += minv[n, g] * xm
            c1 += minv[n + 1, g] * xm
            c2 += minv[n + 2, g] * xm
            c3 += minv[n + 3, g] * xm
    out[m, n] = a0 + c0
    out[m, n + 1] = a1 + c1
    out[m, n + 2] = a2 + c2
    out[m, n + 3] = a3 + c3


@njit(cache=True, nogil=True, parallel=True, fastmath=ORDERED_MATH)
def matmul_vnni_tiles_cpu(xq, xs, xsum, q, scale, minv, has_min, group, n_threads, out) -> int:
    """out[:, :4*(N//4)] for every activation row; returns the first row index left to the caller (N % 4
    leftover rows). Each thread takes a contiguous block of 4-row weight tiles and, per tile, passes every
    activation row over it (the tile stays in L1 for M > 1). q and xq must be C-contiguous."""
    m_rows, k_cols = xq.shape
    n_rows = q.shape[0]
    n_groups = k_cols // group
    g_u = U(group)
    n_chunks = k_cols // CHUNK
    n_vgroups = n_chunks * CHUNK // group
    buf_len = (n_vgroups + 3) // 4 * 16 + 16
    n_tiles = n_rows // TILE_ROWS
    n_blocks = min(n_tiles, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    x_addr = xq.ctypes.data
    q_addr = q.ctypes.data
    w_stride = q.strides[0]
    for blk in prange(n_blocks):
        isum = np.empty(buf_len, np.int32)  # once per block: an allocation per tile would cost ~10%
        buf_addr = isum.ctypes.data
        t_end = (blk + 1) * n_tiles // n_blocks
        for t in range(blk * n_tiles // n_blocks, t_end):
            n = t * TILE_ROWS
            for m in range(m_rows):
                _isum_tile(x_addr + m * k_cols, q_addr + n * w_stride, w_stride, n_chunks, buf_addr, group)
                _tile_outputs(
                    isum, n_vgroups, xq, xs, xsum, m, q, scale, minv, has_min, n, n_groups, g_u, out
                )
    return n_tiles * TILE_ROWS
