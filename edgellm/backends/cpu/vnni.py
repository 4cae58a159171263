"""AVX-512 VNNI dequant-matmul over row-interleaved weight tiles (x86 with avx512vnni only).

Layout ("tile16", made once at load by `to_tiles`): weight rows are taken 16 at a time and interleaved by
4-byte words, qt[t, j, l, :] = q[16t + l, 4j : 4j + 4] (uint8 [T, K/4, 16, 4]), so one 64-byte load holds
the same 4 columns of 16 rows, and the group scales/mins are transposed to sct[t, g, l] = scale[16t + l, g].
A `vpdpbusd` of that load with 4 activation bytes broadcast to every lane adds 4 products to each of 16
row sums at once: no horizontal folding at all, and one weight load serves RM activation rows (register
blocking), which is what makes the GEMM compute-bound instead of shuffle-bound.

`vpdpbusd` multiplies unsigned by signed bytes, so the weights are stored offset by 128 (w ^ 0x80 = w + 128
as uint8) and each group's int32 sum starts at -128 * sum(x over the group): the sum is the exact integer
dot product of the int8 weights with the int8 activations, for any int8 (-128 included).

The float part is matmul._row_dot's, lane-wise and in the same order (acc += (xs * scale) * isum;
macc += minv * xsum; out = acc + macc), with no FMA contraction or reassociation, so every output is
bit-identical to the portable kernels' whatever the batch size and tile position (batch invariance).
Only compiled when first called, and only used when the host has the feature (VNNI_ACTIVE): CPUs without
it (AVX2-only x86, ARM) never see the x86 intrinsic and keep the row layout and the portable kernels.
EDGELLM_NO_VNNI=1 forces the portable path.
"""

from __future__ import annotations

import os

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, prange

from edgellm.backends.cpu.ir_util import declare, splat, switch_intrinsic


def _host_has_vnni() -> bool:
    features = llb.get_host_cpu_features()
    return bool(features.get("avx512vnni") and features.get("avx512bw") and features.get("avx512f"))


VNNI_ACTIVE = _host_has_vnni() and os.environ.get("EDGELLM_NO_VNNI", "") in ("", "0")
TILE = 16  # weight rows per tile = int32 lanes of a zmm
RM = 4  # activation rows per register block (4 x (int, acc, macc) + the group's weight words fit 32 zmm)

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_V16I32 = ir.VectorType(_I32, 16)
_V16F32 = ir.VectorType(_F32, 16)
_FLAGS = ("nsz", "arcp", "afn")  # matmul.ORDERED_MATH: each lane rounds exactly as the scalar code
_DPBUSD = "llvm.x86.avx512.vpdpbusd.512"
_PREFETCH = "llvm.prefetch.p0"
PREFETCH_VECTORS = 64  # weight vectors (64 B) ahead


def to_tiles(
    q: np.ndarray, scale: np.ndarray, minv: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """int8 q [N, K], f32 scale/minv [N, G] -> (qt uint8 [T, K/4, 16, 4], sct [T, G, 16], mnt or None),
    T = ceil(N / 16); padded rows are zero weights with zero scales (their outputs are never stored)."""
    n_rows, k_cols = q.shape
    n_tiles = -(-n_rows // TILE)
    pad = n_tiles * TILE - n_rows
    qu = np.ascontiguousarray(q).view(np.uint8) ^ np.uint8(0x80)
    if pad:
        qu = np.concatenate([qu, np.full((pad, k_cols), 0x80, np.uint8)])
    qt = np.ascontiguousarray(qu.reshape(n_tiles, TILE, k_cols // 4, 4).transpose(0, 2, 1, 3))

    def groups(a: np.ndarray) -> np.ndarray:
        if pad:
            a = np.concatenate([a, np.zeros((pad, a.shape[1]), np.float32)])
        return np.ascontiguousarray(a.reshape(n_tiles, TILE, -1).transpose(0, 2, 1), dtype=np.float32)

    return qt, groups(scale), None if minv is None else groups(minv)


def from_tiles(qt: np.ndarray, n_rows: int) -> np.ndarray:
    """Inverse of to_tiles for the quants: int8 [n_rows, K] (used by tests and get_rows)."""
    n_tiles, kq = qt.shape[0], qt.shape[1]
    q = (qt ^ np.uint8(0x80)).view(np.int8).transpose(0, 2, 1, 3).reshape(n_tiles * TILE, kq * 4)
    return np.ascontiguousarray(q[:n_rows])


def _build(module: ir.Module, name: str, group: int, has_min: bool, rm: int) -> ir.Function:
    """void name(w, sc, mn, n_groups, x, x_stride, xs, xsum, xisum, a_stride, out, out_stride), all i64:
    addresses of the tile's weights/scales/mins, rm activation rows (int8, x_stride bytes apart), their
    per-group scales, sums and int sums (f32/f32/i32, a_stride elements apart), and rm output rows of 16
    floats (out_stride floats apart)."""
    dp = declare(module, _DPBUSD, _V16I32, [_V16I32] * 3)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 12), name)
    fn.linkage = "internal"
    w_a, sc_a, mn_a, n_groups, x_a, x_stride, xs_a, xsum_a, xi_a, a_stride, out_a, out_stride = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    f32p, i32p = _F32.as_pointer(), _I32.as_pointer()
    vi_p, vf_p = _V16I32.as_pointer(), _V16F32.as_pointer()
    w_ptr = b.inttoptr(w_a, vi_p)
    sc_ptr, mn_ptr = b.inttoptr(sc_a, vf_p), b.inttoptr(mn_a, vf_p)
    x_rows = [b.inttoptr(b.add(x_a, b.mul(x_stride, ir.Constant(_I64, m))), i32p) for m in range(rm)]
    a_off = [b.mul(a_stride, ir.Constant(_I64, m)) for m in range(rm)]
    xs_rows = [b.gep(b.inttoptr(xs_a, f32p), [o]) for o in a_off]
    xsum_rows = [b.gep(b.inttoptr(xsum_a, f32p), [o]) for o in a_off]
    xi_rows = [b.gep(b.inttoptr(xi_a, i32p), [o]) for o in a_off]
    zero = ir.Constant(_V16F32, [0.0] * 16)
    words = group // 4  # 4-byte words per group
    b.cbranch(b.icmp_unsigned("==", n_groups, ir.Constant(_I64, 0)), done, loop)

    b.position_at_end(loop)
    g = b.phi(_I64)
    g.add_incoming(ir.Constant(_I64, 0), entry)
    accs = [b.phi(_V16F32) for _ in range(rm)]
    maccs = [b.phi(_V16F32) for _ in range(rm)]
    for phi in accs + maccs:
        phi.add_incoming(zero, entry)
    # int sums start at -128 * sum(x): removes the +128 offset of the stored weights exactly
    # int sums start at -128 * sum(x): removes the +128 offset of the stored weights exactly
    isums = [
        splat(b, b.sub(ir.Constant(_I32, 0), b.shl(b.load(b.gep(p, [g])), ir.Constant(_I32, 7))), _V16I32)
        for p in xi_rows
    ]
    w0 = b.mul(g, ir.Constant(_I64, words))  # first word of the group = index of its first 64-byte vector
    pf = declare(module, _PREFETCH, ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
    for j in range(words):
        # Weights stream from RAM once per call (the model is larger than L3); the hardware prefetcher
        # alone left the batched decode step waiting on memory: ask for the line 4 KiB ahead (~10% faster
        # at 16 sequences). Prefetches never fault, so running past the array's end is harmless.
        ahead = b.gep(w_ptr, [b.add(w0, ir.Constant(_I64, j + PREFETCH_VECTORS))])
        b.call(
            pf,
            [
                b.bitcast(ahead, _I8.as_pointer()),
                ir.Constant(_I32, 0),
                ir.Constant(_I32, 3),
                ir.Constant(_I32, 1),
            ],
        )
        wv = b.load(b.gep(w_ptr, [b.add(w0, ir.Constant(_I64, j))]), align=1)
        for m in range(rm):
            xw = b.load(b.gep(x_rows[m], [b.add(w0, ir.Constant(_I64, j))]), align=1)
            isums[m] = b.call(dp, [isums[m], wv, splat(b, xw, _V16I32)])
    scv = b.load(b.gep(sc_ptr, [g]), align=4)
    mnv = b.load(b.gep(mn_ptr, [g]), align=4) if has_min else None
    new_accs, new_maccs = [], []
    for m in range(rm):
        xs_sc = b.fmul(splat(b, b.load(b.gep(xs_rows[m], [g])), _V16F32), scv, flags=_FLAGS)
        new_accs.append(
            b.fadd(accs[m], b.fmul(xs_sc, b.sitofp(isums[m], _V16F32), flags=_FLAGS), flags=_FLAGS)
        )
        if has_min:
            xm = splat(b, b.load(b.gep(xsum_rows[m], [g])), _V16F32)
            new_maccs.append(b.fadd(maccs[m], b.fmul(mnv, xm, flags=_FLAGS), flags=_FLAGS))
        else:
            new_maccs.append(maccs[m])
    g_next = b.add(g, ir.Constant(_I64, 1))
    g.add_incoming(g_next, loop)
    for phi, nxt in zip(accs + maccs, new_accs + new_maccs, strict=True):
        phi.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", g_next, n_groups), loop, done)

    b.position_at_end(done)
    outs = []
    for last in new_accs + new_maccs:  # every phi first: LLVM wants them at the top of the block
        phi = b.phi(_V16F32)
        phi.add_incoming(zero, entry)
        phi.add_incoming(last, loop)
        outs.append(phi)
    out_ptr = b.inttoptr(out_a, f32p)
    for m in range(rm):
        res = b.fadd(outs[m], outs[rm + m], flags=_FLAGS)
        dst = b.bitcast(b.gep(out_ptr, [b.mul(out_stride, ir.Constant(_I64, m))]), vf_p)
        b.store(res, dst, align=4)
    b.ret_void()
    return fn


def _variant_key(group: int, has_min: bool, rm: int) -> int:
    return (group == 32) * 4 + has_min * 2 + (rm == RM)


# _tile(key, ...): one IR variant per (group size, min term, activation rows per block)
_tile = switch_intrinsic(
    {
        _variant_key(g, mn, rm): (
            f"edgellm_vnni_tile16_g{g}_{'min' if mn else 'nomin'}_rm{rm}",
            lambda m, n, g=g, mn=mn, rm=rm: _build(m, n, g, mn, rm),
        )
        for g in (16, 32)
        for mn in (True, False)
        for rm in (1, RM)
    },
    12,
)


@njit(cache=True, nogil=True, parallel=True)
def matmul_tiles_cpu(xq, xs, xsum, xisum, qt, sct, mnt, has_min, group, n_rows, n_threads, out) -> None:
    """out[M, :n_rows] from the tile16 weights. Each thread takes a contiguous run of tiles; per tile, the
    activation rows pass in blocks of RM (the tile's weights stay in L1), then one at a time. A partial last
    tile is computed into a scratch block and copied. xq/xs/xsum/xisum must be C-contiguous; out's rows
    must be contiguous (any row stride)."""
    m_rows = xq.shape[0]
    n_tiles = qt.shape[0]
    n_groups = sct.shape[1]
    n_blocks = min(n_tiles, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    tile_bytes = qt.strides[0]
    sg_bytes = sct.strides[0]
    out_stride = out.strides[0] // 4
    for blk in prange(n_blocks):
        scratch = np.empty((RM, TILE), np.float32)
        for t in range(blk * n_tiles // n_blocks, (blk + 1) * n_tiles // n_blocks):
            n0 = t * TILE
            full = n0 + TILE <= n_rows
            w = qt.ctypes.data + t * tile_bytes
            sc = sct.ctypes.data + t * sg_bytes
            mn = mnt.ctypes.data + t * sg_bytes
            m = 0
            while m < m_rows:
                rm = RM if m + RM <= m_rows else 1
                dst = out.ctypes.data + (m * out.strides[0] + n0 * 4) if full else scratch.ctypes.data
                key = (group == 32) * 4 + has_min * 2 + (rm == RM)  # _variant_key
                _tile(
                    key, w, sc, mn, n_groups,
                    xq.ctypes.data + m * xq.strides[0], xq.strides[0],
                    xs.ctypes.data + m * xs.strides[0],
                    xsum.ctypes.data + m * xsum.strides[0],
                    xisum.ctypes.data + m * xisum.strides[0],
                    n_groups, dst, out_stride if full else TILE,
                )  # fmt: skip
                if not full:
                    for i in range(rm):
                        for lane in range(n_rows - n0):
                            out[m + i, n0 + lane] = scratch[i, lane]
                m += rm


@njit(cache=True, nogil=True, parallel=True)
def gather_tiles_cpu(qt, sct, mnt, has_min, group, ids, out) -> None:
    """Embedding lookup from the tile16 layout: out[i] = dequantized row ids[i] (same expression as
    packed._gather_grouped, so the same bits as gguf's dequantize)."""
    k_cols = qt.shape[1] * 4
    for i in prange(ids.shape[0]):
        t, lane = ids[i] // TILE, ids[i] % TILE
        for k in range(k_cols):
            g = k // group
            s = sct[t, g, lane]
            v = s * np.float32(np.int8(qt[t, k // 4, lane, k % 4] ^ np.uint8(0x80)))
            out[i, k] = v + mnt[t, g, lane] if has_min else v
