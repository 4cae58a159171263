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
_V4I32 = ir.VectorType(_I32, 4)
_V4F32 = ir.VectorType(ir.FloatType(), 4)
_V16F32 = ir.VectorType(ir.FloatType(), 16)
_FLAGS = ("nsz", "arcp", "afn")  # ORDERED_MATH: no reassoc/contract, so each lane rounds as the scalar code
_TRANSPOSE_4X4 = ir.Constant(_V16I32, [4 * (lane % 4) + lane // 4 for lane in range(16)])  # lane 4a+b <- 4b+a
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


def _load_f4(b: ir.IRBuilder, ptr: ir.Value, g0: ir.Value) -> ir.Value:
    return b.load(b.bitcast(b.gep(ptr, [g0]), _V4F32.as_pointer()), align=4)


def _rows_by_group(b: ir.IRBuilder, row_ptrs: list[ir.Value], g0: ir.Value) -> ir.Value:
    """16 floats, lane 4g + r = row_ptrs[r][g0 + g]: the 4 rows' values of 4 groups in isum's layout."""
    s = [_load_f4(b, p, g0) for p in row_ptrs]
    first8 = ir.Constant(ir.VectorType(_I32, 8), list(range(8)))
    t01, t23 = b.shuffle_vector(s[0], s[1], first8), b.shuffle_vector(s[2], s[3], first8)
    return b.shuffle_vector(
        t01, t23, ir.Constant(_V16I32, [4 * (lane % 4) + lane // 4 for lane in range(16)])
    )


def _add_in_group_order(b: ir.IRBuilder, acc: ir.Value, prod: ir.Value) -> ir.Value:
    """acc[r] += prod[4g + r] for g = 0, 1, 2, 3 in turn: each row's float sum keeps _row_dot's order."""
    for g in range(4):
        acc = b.fadd(
            acc,
            b.shuffle_vector(prod, prod, ir.Constant(_V4I32, list(range(4 * g, 4 * g + 4)))),
            flags=_FLAGS,
        )
    return acc


def _float_quad(b, isums, xs_ptr, xsum_ptr, sc_rows, mn_rows, g0, acc, macc):
    """Groups g0..g0+3 of the 4 rows: acc += (xs[g] * scale[r, g]) * isum, macc += minv[r, g] * xsum[g]."""
    bcast = ir.Constant(_V16I32, [lane // 4 for lane in range(16)])
    xs4 = _load_f4(b, xs_ptr, g0)
    xs_scale = b.fmul(b.shuffle_vector(xs4, xs4, bcast), _rows_by_group(b, sc_rows, g0), flags=_FLAGS)
    acc = _add_in_group_order(b, acc, b.fmul(xs_scale, b.sitofp(isums, _V16F32), flags=_FLAGS))
    if mn_rows is not None:
        xm4 = _load_f4(b, xsum_ptr, g0)
        prod = b.fmul(_rows_by_group(b, mn_rows, g0), b.shuffle_vector(xm4, xm4, bcast), flags=_FLAGS)
        macc = _add_in_group_order(b, macc, prod)
    return acc, macc


def _build_tile_fn(module: ir.Module, name: str, group: int, has_min: bool) -> ir.Function:
    """void name(x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc) (all i64; addresses
    of one activation row (int8 x, f32 xs/xsum), the tile's first weight row (int8 w, f32 scale/minv, rows
    w_stride bytes / sg_stride floats apart), an int32[16] tail and an f32[8] acc).
    Runs the ordered float sum over the groups of every full 4-group step (2 chunks for G=32, 1 for G=16) and
    writes acc[0:4] (scale part) and acc[4:8] (min part) per row; for G=32 with an odd chunk count it stores
    the last chunk's 2 groups' int sums as tail[4j + r] (j = 0, 1) for the caller to finish."""
    dp = module.globals.get(_DPBUSD)
    if dp is None:
        dp = ir.Function(module, ir.FunctionType(_V16I32, [_V16I32] * 3), _DPBUSD)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 11), name)
    fn.linkage = "internal"
    (
        x_addr,
        w_addr,
        w_stride,
        n_chunks,
        tail_addr,
        xs_addr,
        xsum_addr,
        sc_addr,
        mn_addr,
        sg_stride,
        acc_addr,
    ) = fn.args
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    tail = fn.append_basic_block("tail")
    tail_body = fn.append_basic_block("tail_body")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    f32p = ir.FloatType().as_pointer()
    x_ptr = b.inttoptr(x_addr, _I8.as_pointer())
    w0 = b.inttoptr(w_addr, _I8.as_pointer())
    w_ptrs = [w0] + [b.gep(w0, [b.mul(w_stride, ir.Constant(_I64, r))]) for r in range(1, TILE_ROWS)]
    xs_ptr, xsum_ptr = b.inttoptr(xs_addr, f32p), b.inttoptr(xsum_addr, f32p)
    sc0, mn0 = b.inttoptr(sc_addr, f32p), b.inttoptr(mn_addr, f32p)
    sc_rows = [sc0] + [b.gep(sc0, [b.mul(sg_stride, ir.Constant(_I64, r))]) for r in range(1, TILE_ROWS)]
    mn_rows = [mn0] + [b.gep(mn0, [b.mul(sg_stride, ir.Constant(_I64, r))]) for r in range(1, TILE_ROWS)]
    zero4 = ir.Constant(_V4F32, [0.0] * 4)
    step = 2 if group == 32 else 1  # chunks per 4 groups
    n_iter = b.udiv(n_chunks, ir.Constant(_I64, step))
    b.cbranch(b.icmp_unsigned("==", n_iter, ir.Constant(_I64, 0)), tail, loop)

    b.position_at_end(loop)
    i = b.phi(_I64)
    acc = b.phi(_V4F32)
    macc = b.phi(_V4F32)
    for phi, init in ((i, ir.Constant(_I64, 0)), (acc, zero4), (macc, zero4)):
        phi.add_incoming(init, entry)
    off = b.mul(i, ir.Constant(_I64, CHUNK * step))
    if group == 16:  # the 4 quads of a chunk are its 4 groups: lane 4j + r = E[4r + j]
        e = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
        isums = b.shuffle_vector(
            e, e, ir.Constant(_V16I32, [4 * (lane % 4) + lane // 4 for lane in range(16)])
        )
    else:
        off_b = b.add(off, ir.Constant(_I64, CHUNK))
        ea = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
        eb = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off_b), w_ptrs, off_b)
        isums = _pair_groups(b, _comb(b, ea, eb))
    g0 = b.mul(i, ir.Constant(_I64, 4))
    acc_next, macc_next = _float_quad(
        b, isums, xs_ptr, xsum_ptr, sc_rows, mn_rows if has_min else None, g0, acc, macc
    )
    i_next = b.add(i, ir.Constant(_I64, 1))
    for phi, nxt in ((i, i_next), (acc, acc_next), (macc, macc_next)):
        phi.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", i_next, n_iter), loop, tail)

    b.position_at_end(tail)
    acc_out = b.phi(_V4F32)
    macc_out = b.phi(_V4F32)
    acc_out.add_incoming(zero4, entry)
    acc_out.add_incoming(acc_next, loop)
    macc_out.add_incoming(zero4, entry)
    macc_out.add_incoming(macc_next, loop)
    acc_ptr = b.inttoptr(acc_addr, f32p)
    b.store(acc_out, b.bitcast(acc_ptr, _V4F32.as_pointer()), align=4)
    b.store(macc_out, b.bitcast(b.gep(acc_ptr, [ir.Constant(_I64, 4)]), _V4F32.as_pointer()), align=4)
    odd = b.icmp_unsigned("!=", b.urem(n_chunks, ir.Constant(_I64, step)), ir.Constant(_I64, 0))
    b.cbranch(odd, tail_body, done)
    b.position_at_end(tail_body)  # G=32, odd chunk count: the last chunk pairs with zeros
    off = b.mul(n_iter, ir.Constant(_I64, CHUNK * step))
    ea = _chunk_quads(b, dp, _load_x_unsigned(b, x_ptr, off), w_ptrs, off)
    res = _pair_groups(b, _comb(b, ea, ir.Constant(_V16I32, [0] * 16)))
    _store(b, b.inttoptr(tail_addr, _I32.as_pointer()), ir.Constant(_I64, 0), res)
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


def _make_intrinsic(group: int, has_min: bool):
    name = f"edgellm_vnni_tile4_g{group}_{'min' if has_min else 'nomin'}"

    @intrinsic
    def tile_fn(typingctx, x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc):
        sig = types.void(*([types.intp] * 11))

        def codegen(context, builder, signature, args):
            module = builder.module
            fn = module.globals.get(name)
            if fn is None:
                fn = _build_tile_fn(module, name, group, has_min)
            builder.call(fn, args)
            return context.get_dummy_value()

        return sig, codegen

    return tile_fn


_tile_g32_min = _make_intrinsic(32, True)
_tile_g32 = _make_intrinsic(32, False)
_tile_g16_min = _make_intrinsic(16, True)
_tile_g16 = _make_intrinsic(16, False)


@njit(cache=True, nogil=True, inline="always")
def _tile(group, has_min, x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc) -> None:
    if group == 32:
        if has_min:
            _tile_g32_min(x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc)
        else:
            _tile_g32(x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc)
    elif has_min:
        _tile_g16_min(x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc)
    else:
        _tile_g16(x, w, w_stride, n_chunks, tail, xs, xsum, scale, minv, sg_stride, acc)


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _group_dot_2d(xq, m, q, n, base, g_u) -> np.int32:
    """Portable group sum for the groups past the last full 64-byte chunk (matmul._group_dot's loop)."""
    acc = np.int32(0)
    for k in range(U(0), g_u):
        acc += np.int32(xq[m, base + k]) * np.int32(q[n, base + k])
    return acc


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH, inline="always")
def _finish_tile(
    acc, tail, g_start, n_vgroups, xq, xs, xsum, m, q, scale, minv, has_min, n, g_u, out
) -> None:
    """Continue the tile's 4 float sums from the IR's full steps: the buffered odd-chunk groups, then the
    groups past the last 64-byte chunk (portable int sums), in group order as in matmul._row_dot."""
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    c0, c1, c2, c3 = acc[4], acc[5], acc[6], acc[7]
    n_groups = scale.shape[1]
    for g in range(g_start, n_groups):
        if g < n_vgroups:
            j = 4 * (g - g_start)
            i0, i1, i2, i3 = tail[j], tail[j + 1], tail[j + 2], tail[j + 3]
        else:
            base = U(g) * g_u
            i0 = _group_dot_2d(xq, m, q, n, base, g_u)
            i1 = _group_dot_2d(xq, m, q, n + 1, base, g_u)
            i2 = _group_dot_2d(xq, m, q, n + 2, base, g_u)
            i3 = _group_dot_2d(xq, m, q, n + 3, base, g_u)
        xg = xs[m, g]
        a0 += (xg * scale[n, g]) * np.float32(i0)
        a1 += (xg * scale[n + 1, g]) * np.float32(i1)
        a2 += (xg * scale[n + 2, g]) * np.float32(i2)
        a3 += (xg * scale[n + 3, g]) * np.float32(i3)
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
    activation row over it (the tile stays in L1 for M > 1). All inputs but out must be C-contiguous."""
    m_rows, k_cols = xq.shape
    n_rows = q.shape[0]
    g_u = U(group)
    n_chunks = k_cols // CHUNK
    n_vgroups = n_chunks * CHUNK // group
    g_start = n_vgroups // 4 * 4  # groups the IR finishes; the rest (< 4 + tail) are finished here
    n_tiles = n_rows // TILE_ROWS
    n_blocks = min(n_tiles, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    sg_stride = scale.strides[0] // 4
    for blk in prange(n_blocks):
        # once per block: an allocation per tile would cost more than the tile
        tail = np.zeros(16, np.int32)
        acc = np.zeros(8, np.float32)
        tail_addr = tail.ctypes.data
        acc_addr = acc.ctypes.data
        for t in range(blk * n_tiles // n_blocks, (blk + 1) * n_tiles // n_blocks):
            n = t * TILE_ROWS
            w_addr = q.ctypes.data + n * q.strides[0]
            sc_addr = scale.ctypes.data + n * scale.strides[0]
            mn_addr = minv.ctypes.data + n * minv.strides[0]
            for m in range(m_rows):
                _tile(
                    group,
                    has_min,
                    xq.ctypes.data + m * xq.strides[0],
                    w_addr,
                    q.strides[0],
                    n_chunks,
                    tail_addr,
                    xs.ctypes.data + m * xs.strides[0],
                    xsum.ctypes.data + m * xsum.strides[0],
                    sc_addr,
                    mn_addr,
                    sg_stride,
                    acc_addr,
                )
                _finish_tile(
                    acc, tail, g_start, n_vgroups, xq, xs, xsum, m, q, scale, minv, has_min, n, g_u, out
                )
    return n_tiles * TILE_ROWS
