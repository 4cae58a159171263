"""The paged-attention inner loops as LLVM vector IR (attention.py drives them), per KV cache type.

Q.K for 16 positions of one block and P.V over a block's rows, for every GQA group size up to MAX_GROUP:
the accumulators stay in registers (LLVM does not produce this form from Numba loops; it keeps them in
memory). Only generic vector operations and llvm.fma, which LLVM lowers for any target (AVX-512, AVX2, NEON).

f16 cache (uint16 bits): K [n_blocks, Hkv, d, block_size] (transposed per block, so one 16-value load is
dimension i of 16 consecutive positions: Q.K is 16-lane FMAs with q[i] broadcast, no horizontal sums);
V [n_blocks, block_size, Hkv, dv] (rows).

q8_0 cache (uint8 bytes, ggml's block_q8_0: an f16 scale and 32 int8 values along the head dimension):
K [n_blocks, Hkv, d/32, 34, block_size]: per 32-dim block c, rows 0-1 hold the block_size f16 scales
(2 * block_size bytes) and rows 2..33 the int8 values of dims c*32 .. c*32+31, transposed as for f16;
V [n_blocks, block_size, Hkv, dv/32, 34]: each row is ggml's q8_0 blocks as they are (scale, then 32 values).
The kernels widen the int8 values in registers: no dequantized copy of the cache.
"""

from __future__ import annotations

from llvmlite import ir

from edgellm.backends.cpu.ir_util import declare, splat, switch_intrinsic

LANES = 16  # floats per vector: K positions per Q.K step, V columns per accumulator
MAX_GROUP = 8  # query heads per KV head with an IR kernel; larger groups use the Numba loops
_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_VH = ir.VectorType(ir.HalfType(), LANES)


def _load_f16x16(b: ir.IRBuilder, addr: ir.Value) -> ir.Value:
    """16 f16 values (uint16 bits in the cache) at a byte address, widened to f32 (vcvtph2ps on x86)."""
    return b.fpext(b.load(b.inttoptr(addr, _VH.as_pointer()), align=2), _VF)


def _splat(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return splat(b, v, _VF)


def _fma_fn(module: ir.Module) -> ir.Function:
    return declare(module, "llvm.fma.v16f32", _VF, [_VF] * 3)


def _counted_loop(b: ir.IRBuilder, fn: ir.Function, count: ir.Value, carried: list[ir.Value], body):
    """for i in range(count) with loop-carried values: body(b, i, values) -> new values. Returns the
    values after the loop (the initial ones when count == 0)."""
    pre = b.block
    loop, after = fn.append_basic_block("loop"), fn.append_basic_block("after")
    b.cbranch(b.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, after)
    b.position_at_end(loop)
    i = b.phi(_I64)
    phis = [b.phi(v.type) for v in carried]
    i.add_incoming(ir.Constant(_I64, 0), pre)
    for phi, v in zip(phis, carried, strict=True):
        phi.add_incoming(v, pre)
    new = body(b, i, phis)
    i_next = b.add(i, ir.Constant(_I64, 1))
    end = b.block
    i.add_incoming(i_next, end)
    for phi, v in zip(phis, new, strict=True):
        phi.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", i_next, count), loop, after)
    b.position_at_end(after)
    outs = []
    for v, v_new in zip(carried, new, strict=True):
        out = b.phi(v.type)
        out.add_incoming(v, pre)
        out.add_incoming(v_new, end)
        outs.append(out)
    return outs


def _qk_entry(module: ir.Module, name: str, group: int) -> tuple[ir.Function, ir.IRBuilder, list[ir.Value]]:
    """A Q.K kernel `void name(q, d, ... x5)` (7 i64 arguments) and its entry block: (function, builder at
    the entry, the group's Q row pointers q + g*d floats)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 7), name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    q_ptr = b.inttoptr(fn.args[0], _F32.as_pointer())
    return fn, b, [b.gep(q_ptr, [b.mul(fn.args[1], ir.Constant(_I64, g))]) for g in range(group)]


def _store_scores(b: ir.IRBuilder, out_a: ir.Value, out_stride: ir.Value, rows: list[ir.Value]) -> None:
    """Store the group's 16 scores each at out + g*out_stride floats, and return."""
    out_ptr = b.inttoptr(out_a, _F32.as_pointer())
    for g, v in enumerate(rows):
        dst = b.gep(out_ptr, [b.mul(out_stride, ir.Constant(_I64, g))])
        b.store(v, b.bitcast(dst, _VF.as_pointer()), align=4)
    b.ret_void()


def _build_qk(module: ir.Module, name: str, group: int) -> ir.Function:
    """void qk(q, d, k, k_row, out, out_stride, scale_bits): out[g*out_stride + l] = scale *
    sum_i q[g*d + i] * k[i*k_row + l] for 16 positions l (k: address of dim 0 of the 16 positions; k_row:
    bytes between dims; q f32 [group, d]; scale: f32 bits in an i64)."""
    fn, b, q_rows = _qk_entry(module, name, group)
    _, d, k_a, k_row, out_a, out_stride, scale_bits = fn.args
    fma = _fma_fn(module)
    zero = ir.Constant(_VF, [0.0] * LANES)

    def body(b: ir.IRBuilder, i: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        kv = _load_f16x16(b, b.add(k_a, b.mul(i, k_row)))
        return [b.call(fma, [_splat(b, b.load(b.gep(q_rows[g], [i]))), kv, accs[g]]) for g in range(group)]

    accs = _counted_loop(b, fn, d, [zero] * group, body)
    scale = _splat(b, b.bitcast(b.trunc(scale_bits, _I32), _F32))
    _store_scores(b, out_a, out_stride, [b.fmul(a, scale) for a in accs])
    return fn


def _build_pv(module: ir.Module, name: str, group: int, n_vec: int, load_row=None) -> ir.Function:  # noqa: ANN001
    """void pv(w, w_stride, n, v, v_row, acc, acc_stride): acc[g][c] += sum_j w[g*w_stride + j] *
    v[j*v_row + c] for j < n in order, over n_vec*16 columns c (v: address of row 0's first f16 column;
    v_row: bytes between rows; acc f32 rows acc_stride floats apart, loaded once and stored once).
    load_row(b, row_address) -> the n_vec f32 vectors of a row (default: f16 values)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 7), name)
    fn.linkage = "internal"
    w_a, w_stride, n, v_a, v_row, acc_a, acc_stride = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = _fma_fn(module)
    f32p, vfp = _F32.as_pointer(), _VF.as_pointer()
    w_ptr, acc_ptr = b.inttoptr(w_a, f32p), b.inttoptr(acc_a, f32p)
    w_rows = [b.gep(w_ptr, [b.mul(w_stride, ir.Constant(_I64, g))]) for g in range(group)]
    acc_ptrs = []
    for g in range(group):
        row = b.gep(acc_ptr, [b.mul(acc_stride, ir.Constant(_I64, g))])
        acc_ptrs += [b.bitcast(b.gep(row, [ir.Constant(_I64, LANES * c)]), vfp) for c in range(n_vec)]
    init = [b.load(p, align=4) for p in acc_ptrs]
    if load_row is None:

        def load_row(b: ir.IRBuilder, row: ir.Value) -> list[ir.Value]:
            return [_load_f16x16(b, b.add(row, ir.Constant(_I64, 2 * LANES * c))) for c in range(n_vec)]

    def body(b: ir.IRBuilder, j: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        vs = load_row(b, b.add(v_a, b.mul(j, v_row)))
        new = []
        for g in range(group):
            w = _splat(b, b.load(b.gep(w_rows[g], [j])))
            new += [b.call(fma, [w, vs[c], accs[g * n_vec + c]]) for c in range(n_vec)]
        return new

    for p, v in zip(acc_ptrs, _counted_loop(b, fn, n, init, body), strict=True):
        b.store(v, p, align=4)
    b.ret_void()
    return fn


def pv_vectors(group: int) -> int:
    return 4 if group <= 6 else 2  # group * n_vec accumulators + n_vec rows stay within 32 registers


# qk(group, ...) / pv(group, ...): one IR variant per GQA group size (its accumulators stay in registers)
qk_f16_call = switch_intrinsic(
    {g: (f"edgellm_qk_g{g}", lambda m, n, g=g: _build_qk(m, n, g)) for g in range(1, MAX_GROUP + 1)}, 7
)
pv_f16_call = switch_intrinsic(
    {
        g: (f"edgellm_pv_g{g}", lambda m, n, g=g: _build_pv(m, n, g, pv_vectors(g)))
        for g in range(1, MAX_GROUP + 1)
    },
    7,
)


# ---- q8_0 cache --------------------------------------------------------------------------------------
_VI8 = ir.VectorType(ir.IntType(8), LANES)
Q8_BLOCK = 32  # values per q8_0 block
Q8_BYTES = 34  # bytes per q8_0 block: f16 scale + 32 int8


def _load_i8x16(b: ir.IRBuilder, addr: ir.Value) -> ir.Value:
    """16 int8 values at a byte address, widened to f32 (vpmovsxbd + vcvtdq2ps on x86)."""
    return b.sitofp(b.load(b.inttoptr(addr, _VI8.as_pointer()), align=1), _VF)


def _load_f16(b: ir.IRBuilder, addr: ir.Value) -> ir.Value:
    return b.fpext(b.load(b.inttoptr(addr, ir.HalfType().as_pointer()), align=1), _F32)


def _build_qk_q8_0(module: ir.Module, name: str, group: int) -> ir.Function:
    """void qk(q, d, kq, ks, k_row, out, out_stride): out[g*out_stride + l] = sum_c ks[c][l] *
    sum_{i<32} q[g*d + c*32 + i] * kq[c][i][l] for 16 positions l (q f32 [group, d], already times the
    attention scale; kq: address of dim 0's values of the 16 positions, ks: of their first scales; k_row:
    bytes between rows = block_size; a 32-dim block spans 34 rows)."""
    fn, b, q_rows = _qk_entry(module, name, group)
    _, d, kq_a, ks_a, k_row, out_a, out_stride = fn.args
    fma = _fma_fn(module)
    zero = ir.Constant(_VF, [0.0] * LANES)
    block_bytes = b.mul(k_row, ir.Constant(_I64, Q8_BYTES))

    def block(b: ir.IRBuilder, c: ir.Value, totals: list[ir.Value]) -> list[ir.Value]:
        kq_c = b.add(kq_a, b.mul(c, block_bytes))
        dim0 = b.mul(c, ir.Constant(_I64, Q8_BLOCK))

        def dim(b: ir.IRBuilder, i: ir.Value, parts: list[ir.Value]) -> list[ir.Value]:
            kv = _load_i8x16(b, b.add(kq_c, b.mul(i, k_row)))
            di = b.add(dim0, i)
            qs = [_splat(b, b.load(b.gep(q_rows[g], [di]))) for g in range(group)]
            return [b.call(fma, [qs[g], kv, parts[g]]) for g in range(group)]

        parts = _counted_loop(b, fn, ir.Constant(_I64, Q8_BLOCK), [zero] * group, dim)
        scales = _load_f16x16(b, b.add(ks_a, b.mul(c, block_bytes)))
        return [b.call(fma, [parts[g], scales, totals[g]]) for g in range(group)]

    n_blocks = b.udiv(d, ir.Constant(_I64, Q8_BLOCK))
    _store_scores(b, out_a, out_stride, _counted_loop(b, fn, n_blocks, [zero] * group, block))
    return fn


def _build_pv_q8_0(module: ir.Module, name: str, group: int, n_vec: int) -> ir.Function:
    """_build_pv over q8_0 rows: v the address of row 0's block holding the first column (n_vec even:
    whole blocks); each block's values are widened and times its scale once per row, then shared by the
    group's FMAs."""

    def load_row(b: ir.IRBuilder, row: ir.Value) -> list[ir.Value]:
        vs = []
        for blk in range(n_vec // 2):
            at = b.add(row, ir.Constant(_I64, Q8_BYTES * blk))
            scale = _splat(b, _load_f16(b, at))
            for half in range(2):
                vals = _load_i8x16(b, b.add(at, ir.Constant(_I64, 2 + LANES * half)))
                vs.append(b.fmul(vals, scale))
        return vs

    return _build_pv(module, name, group, n_vec, load_row)


qk_q8_0_call = switch_intrinsic(
    {
        g: (f"edgellm_qk_q8_0_g{g}", lambda m, n, g=g: _build_qk_q8_0(m, n, g))
        for g in range(1, MAX_GROUP + 1)
    },
    7,
)
pv_q8_0_call = switch_intrinsic(
    {
        g: (f"edgellm_pv_q8_0_g{g}", lambda m, n, g=g: _build_pv_q8_0(m, n, g, pv_vectors(g)))
        for g in range(1, MAX_GROUP + 1)
    },
    7,
)
