"""LLVM IR of the tile kernel: one function per (CPU tier, tile layout, activation rows per block).

For one tile (16 weight rows) and rm activation rows it walks the row in units (tile_layouts.TileLayout
.unit columns). Per group of the unit and per 4-column word: take the word's 64-byte vector of the lo
plane (its low or high nibbles, or its bytes), OR in the high bits from the hi plane shifted to bit 4 (a
table type instead replaces each nibble by its table byte with the tier's byte shuffle), and the tier's
dot (`vpdpbusd` on AVX-512 VNNI) with the 4 activation bytes broadcast, into the group's int32 sums (16
rows at once; tier_ir.py has each tier's instructions).
The sums start at -offset * sum(x over the group), which removes the unsigned storage offset exactly,
so each is the exact integer dot product of the row layout's signed quants with the int8 activations
(a tier with a signed dot takes the 8-bit layouts' bytes ^ 0x80, the signed quants, and starts at 0).
Then the float part, lane-wise and in matmul._row_dot's order (acc += (xs * scale) * isum;
macc += min * xsum; out = acc + macc), no FMA contraction or reassociation: bit-identical to the
portable kernels whatever the batch size and tile position.

Numba's on-disk cache keys a kernel on its own source file only; the functions that embed this IR
(vnni.matmul_tiles_*, matmul.matmul_tiles_fused_*, layer.decoder_layer_cpu) are made to follow every
source of the CPU backend (numba_cache.follow_sources), so an edit here recompiles them. A new function
that calls them must do the same.
"""

from __future__ import annotations

from llvmlite import ir

from edgellm.backends.cpu.ir_util import declare, splat
from edgellm.backends.cpu.tier_ir import ACTIVATION_MAX, PAIR_SUM_MAX, V64I8
from edgellm.backends.cpu.tiers import TileOps
from edgellm.backends.cpu.tile_layouts import E8M0, F16, I8, TILE

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_V16I32 = ir.VectorType(_I32, TILE)
_V16F32 = ir.VectorType(_F32, TILE)
_V16I16 = ir.VectorType(_I16, TILE)
_V16I8 = ir.VectorType(_I8, TILE)
_V16F16 = ir.VectorType(ir.HalfType(), TILE)
_FLAGS = ("nsz", "arcp", "afn")  # matmul.ORDERED_MATH: each lane rounds exactly as the scalar code
_PREFETCH = "llvm.prefetch.p0"
PREFETCH_VECTORS = 64  # weight vectors (64 B) ahead
N_ARGS = 15


def _c64(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _vconst(v: int) -> ir.Constant:
    return ir.Constant(_V16I32, [v] * TILE)


def _max_weight(split: int, hi_bits: int, lut: tuple) -> int:
    """The largest unsigned weight byte a layout gives the dot."""
    return max(lut) if lut else (16 << hi_bits) - 1 if split else 255


def build_tile_kernel(module: ir.Module, name: str, key: tuple, rm: int, ops: TileOps) -> ir.Function:
    """void name(lo, hi, d, sub, m, msub, n_units, x, x_stride, xs, xsum, xisum, a_stride, out,
    out_stride), all i64: addresses of the tile's planes, rm activation rows (int8, x_stride bytes apart),
    their per-group scales, sums and int sums (f32/f32/i32, a_stride elements apart), and rm output rows
    of 16 floats (out_stride floats apart). `key` is a TileLayout.key; ops the tier's primitives."""
    split, hi_bits, hi_stride, offset, group, unit, d_cols, d_kind, sub_kind, m_kind, m_neg_sub = key[:11]
    lut = key[11:]
    signed = offset == 128 and ops.signed_dot is not None  # bytes ^ 0x80 = the signed quants
    top = _max_weight(split, hi_bits, lut)
    if not signed and top > ops.dot_max:
        raise ValueError(f"layout {key[:11]}: weights up to {top} overflow the tier's dot ({ops.dot_max})")
    dot = ops.signed_dot if signed else ops.dot
    # Words whose int16 pair sums add up without overflow (each lane: 2 products of at most top * 128 per
    # word): summed in int16, widened once (tier_ir's pair_dot). 1: the plain dot per word.
    pair_words = PAIR_SUM_MAX // (2 * top * ACTIVATION_MAX) if ops.pair_dot and not signed else 1
    table = [v ^ 0x80 for v in lut] if signed else list(lut)
    lut_vec = ir.Constant(V64I8, table * 4) if lut else None  # the table in each 128-bit lane
    pf = declare(module, _PREFETCH, ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * N_ARGS), name)
    fn.linkage = "internal"
    lo_a, hi_a, d_a, sub_a, m_a, msub_a, n_units = fn.args[:7]
    x_a, x_stride, xs_a, xsum_a, xi_a, a_stride, out_a, out_stride = fn.args[7:]
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    f32p, i32p = _F32.as_pointer(), _I32.as_pointer()
    vi_p = _V16I32.as_pointer()
    lo_ptr, hi_ptr = b.inttoptr(lo_a, vi_p), b.inttoptr(hi_a, vi_p)
    x_rows = [b.inttoptr(b.add(x_a, b.mul(x_stride, _c64(m))), i32p) for m in range(rm)]
    a_off = [b.mul(a_stride, _c64(m)) for m in range(rm)]
    xs_rows = [b.gep(b.inttoptr(xs_a, f32p), [o]) for o in a_off]
    xsum_rows = [b.gep(b.inttoptr(xsum_a, f32p), [o]) for o in a_off]
    xi_rows = [b.gep(b.inttoptr(xi_a, i32p), [o]) for o in a_off]
    zero = ir.Constant(_V16F32, [0.0] * TILE)
    lo_vecs = (unit // 2 if split else unit) // 4  # 64-byte vectors of the lo plane per unit
    hi_vecs = unit * hi_bits // 32
    units_per_d = d_cols // unit
    groups = unit // group
    b.cbranch(b.icmp_unsigned("==", n_units, _c64(0)), done, loop)

    b.position_at_end(loop)
    u = b.phi(_I64)
    u.add_incoming(_c64(0), entry)
    accs = [b.phi(_V16F32) for _ in range(rm)]
    maccs = [b.phi(_V16F32) for _ in range(rm)]
    for phi in accs + maccs:
        phi.add_incoming(zero, entry)
    lo0, hi0 = b.mul(u, _c64(lo_vecs)), b.mul(u, _c64(hi_vecs))

    def prefetch(base: ir.Value, first: ir.Value, j: int) -> None:
        # Weights stream from RAM once per call: ask for the line 4 KiB ahead (the hardware prefetcher
        # alone left the batched decode step waiting on memory), to the cache level the tier names
        # (TileOps.prefetch_locality). Prefetches never fault past the end.
        ahead = b.gep(base, [b.add(first, _c64(j + PREFETCH_VECTORS))])
        b.call(
            pf,
            [
                b.bitcast(ahead, _I8.as_pointer()),
                ir.Constant(_I32, 0),
                ir.Constant(_I32, ops.prefetch_locality),
                ir.Constant(_I32, 1),
            ],
        )

    lo_cache: dict[int, ir.Value] = {}
    hi_cache: dict[int, ir.Value] = {}

    def lo_vec(j: int) -> ir.Value:
        if j not in lo_cache:
            prefetch(lo_ptr, lo0, j)
            lo_cache[j] = b.load(b.gep(lo_ptr, [b.add(lo0, _c64(j))]), align=1)
        return lo_cache[j]

    def hi_vec(j: int) -> ir.Value:
        if j not in hi_cache:
            prefetch(hi_ptr, hi0, j)
            hi_cache[j] = b.load(b.gep(hi_ptr, [b.add(hi0, _c64(j))]), align=1)
        return hi_cache[j]

    def weights(col: int) -> ir.Value:
        """The unsigned weights of columns col..col+3 of the unit, one byte each, 16 rows."""
        if split:
            run, within = divmod(col, 2 * split)
            high = within >= split
            v = lo_vec((run * split + within - split * high) // 4)
            w = b.and_(b.lshr(v, _vconst(4)) if high else v, _vconst(0x0F0F0F0F))
            if lut_vec is not None:  # each nibble (a byte 0..15) picks its table value
                w = b.bitcast(ops.shuffle(b, lut_vec, b.bitcast(w, V64I8)), _V16I32)
        else:
            w = lo_vec(col // 4)
            if signed:
                w = b.xor(w, _vconst(-0x7F7F7F80))  # 0x80808080
        if hi_bits:
            field, o = divmod(col, hi_stride)
            v = hi_vec(o // 4)
            shift = 4 - hi_bits * field  # bit-field `field` of each byte moves to bit 4
            v = b.shl(v, _vconst(shift)) if shift > 0 else b.lshr(v, _vconst(-shift)) if shift < 0 else v
            w = b.or_(w, b.and_(v, _vconst(((1 << hi_bits) - 1) * 0x10101010)))
        return w

    def widen_scale(addr: ir.Value, index: ir.Value, kind: int) -> ir.Value:
        """16 lanes of a [.., 16] d/m plane at element `index`, as f32: f16 bits widened, E8M0 exponents
        made into their power of two (gguf's e8m0_to_fp32_half), or f32."""
        if kind == F16:
            raw = b.load(b.gep(b.inttoptr(addr, _V16I16.as_pointer()), [index]), align=2)
            return b.fpext(b.bitcast(raw, _V16F16), _V16F32)
        if kind == E8M0:  # e < 2: the subnormal 2^(e - 128) = 0x00200000 << e; else the exponent field e - 1
            e = b.zext(b.load(b.gep(b.inttoptr(addr, _V16I8.as_pointer()), [index]), align=1), _V16I32)
            tiny = b.icmp_unsigned("<", e, _vconst(2))
            bits = b.select(tiny, b.shl(_vconst(0x00200000), e), b.shl(b.sub(e, _vconst(1)), _vconst(23)))
            return b.bitcast(bits, _V16F32)
        return b.load(b.gep(b.inttoptr(addr, _V16F32.as_pointer()), [index]), align=4)

    def widen_bytes(addr: ir.Value, index: ir.Value, signed: bool) -> ir.Value:
        """16 lanes of a [.., 16] byte plane (sub-scales) at element `index`, as f32."""
        raw = b.load(b.gep(b.inttoptr(addr, _V16I8.as_pointer()), [index]), align=1)
        return b.sitofp(b.sext(raw, _V16I32) if signed else b.zext(raw, _V16I32), _V16F32)

    d_index = b.udiv(u, _c64(units_per_d))
    dv = widen_scale(d_a, d_index, d_kind)
    mv = widen_scale(m_a, d_index, m_kind) if m_kind else None
    new_accs, new_maccs = list(accs), list(maccs)
    for gi in range(groups):
        g = b.add(b.mul(u, _c64(groups)), _c64(gi))
        if offset and not signed:  # sums start at -offset * sum(x): stored weights = the quants + offset
            isums = [
                splat(b, b.mul(b.load(b.gep(p, [g])), ir.Constant(_I32, -offset)), _V16I32) for p in xi_rows
            ]
        else:
            isums = [_vconst(0)] * rm
        cols = list(range(gi * group, (gi + 1) * group, 4))
        chunk = pair_words
        for c0 in range(0, len(cols), chunk):
            pairs: list[ir.Value | None] = [None] * rm
            for col in cols[c0 : c0 + chunk]:
                w = weights(col)
                xw_index = b.add(b.mul(u, _c64(unit // 4)), _c64(col // 4))
                for m in range(rm):
                    xw = splat(b, b.load(b.gep(x_rows[m], [xw_index]), align=1), _V16I32)
                    if chunk == 1:
                        isums[m] = dot(b, isums[m], w, xw)
                    else:
                        p = ops.pair_dot(b, w, xw)
                        pairs[m] = p if pairs[m] is None else b.add(pairs[m], p)
            if chunk > 1:
                isums = [ops.pair_widen(b, isums[m], pairs[m]) for m in range(rm)]
        scv = b.fmul(dv, widen_bytes(sub_a, g, sub_kind == I8), flags=_FLAGS) if sub_kind else dv
        mnv = mv
        if m_kind and m_neg_sub:  # the K-quants' min: -(dmin * mn)
            mnv = b.fneg(b.fmul(mv, widen_bytes(msub_a, g, False), flags=_FLAGS))
        for m in range(rm):
            xs_sc = b.fmul(splat(b, b.load(b.gep(xs_rows[m], [g])), _V16F32), scv, flags=_FLAGS)
            term = b.fmul(xs_sc, b.sitofp(isums[m], _V16F32), flags=_FLAGS)
            new_accs[m] = b.fadd(new_accs[m], term, flags=_FLAGS)
            if mnv is not None:
                xm = splat(b, b.load(b.gep(xsum_rows[m], [g])), _V16F32)
                new_maccs[m] = b.fadd(new_maccs[m], b.fmul(mnv, xm, flags=_FLAGS), flags=_FLAGS)
    u_next = b.add(u, _c64(1))
    u.add_incoming(u_next, loop)
    for phi, nxt in zip(accs + maccs, new_accs + new_maccs, strict=True):
        phi.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", u_next, n_units), loop, done)

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
        dst = b.bitcast(b.gep(out_ptr, [b.mul(out_stride, _c64(m))]), _V16F32.as_pointer())
        b.store(res, dst, align=4)
    b.ret_void()
    return fn
