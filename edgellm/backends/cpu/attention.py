"""Paged attention on the CPU: Q.K and P.V inner loops written as LLVM vector IR, the rest in Numba.

The cache holds f16 values (uint16 bit patterns, as llama.cpp's f16 KV cache: half the bytes of f32,
and attention over a long batch is bound by reading them), widened to f32 in registers.
K cache layout: [n_blocks, Hkv, d, block_size] (each block's keys transposed per KV head), so one 16-float
load holds dimension i of 16 consecutive positions and Q.K for 16 positions is 16-lane FMAs with q[i]
broadcast: no horizontal sums. V cache layout: [n_blocks, block_size, Hkv, dv] (rows), so P.V adds
w[j] * V[j] into accumulators held in registers over a block's rows. LLVM does not produce either form
from Numba loops (it keeps the accumulators in memory); the IR uses only generic vector operations and
llvm.fma, which LLVM lowers for any target (AVX-512, AVX2, NEON).

Each (token, KV head) is one work item; its query heads (the GQA group) share every K/V load. Positions run
in order and each output's sums are fixed by its own token, so results do not depend on the batch.
Roundings follow llama.cpp's CPU attention: Q in f16 for Q.K, f32 exps with a float64 sum, f16 weights
for P.V (the cache holds f16-rounded values).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange

from edgellm.backends.cpu.fp16 import HALF_OPS_NATIVE, f16_bits_to_f32, f16_round_inplace
from edgellm.backends.cpu.ir_util import declare, splat, switch_intrinsic

SAFE_MATH = {"reassoc", "contract", "nsz", "arcp", "afn"}  # no nnan/ninf: softmax uses -inf
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


def _build_qk(module: ir.Module, name: str, group: int) -> ir.Function:
    """void qk(q, d, k, k_row, out, out_stride, scale_bits): out[g*out_stride + l] = scale *
    sum_i q[g*d + i] * k[i*k_row + l] for 16 positions l (k: address of dim 0 of the 16 positions; k_row:
    bytes between dims; q f32 [group, d]; scale: f32 bits in an i64)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64] * 7), name)
    fn.linkage = "internal"
    q_a, d, k_a, k_row, out_a, out_stride, scale_bits = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = _fma_fn(module)
    f32p = _F32.as_pointer()
    q_ptr = b.inttoptr(q_a, f32p)
    q_rows = [b.gep(q_ptr, [b.mul(d, ir.Constant(_I64, g))]) for g in range(group)]
    zero = ir.Constant(_VF, [0.0] * LANES)

    def body(b: ir.IRBuilder, i: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        kv = _load_f16x16(b, b.add(k_a, b.mul(i, k_row)))
        return [b.call(fma, [_splat(b, b.load(b.gep(q_rows[g], [i]))), kv, accs[g]]) for g in range(group)]

    accs = _counted_loop(b, fn, d, [zero] * group, body)
    scale = _splat(b, b.bitcast(b.trunc(scale_bits, _I32), _F32))
    out_ptr = b.inttoptr(out_a, f32p)
    for g in range(group):
        dst = b.gep(out_ptr, [b.mul(out_stride, ir.Constant(_I64, g))])
        b.store(b.fmul(accs[g], scale), b.bitcast(dst, _VF.as_pointer()), align=4)
    b.ret_void()
    return fn


def _build_pv(module: ir.Module, name: str, group: int, n_vec: int) -> ir.Function:
    """void pv(w, w_stride, n, v, v_row, acc, acc_stride): acc[g][c] += sum_j w[g*w_stride + j] *
    v[j*v_row + c] for j < n in order, over n_vec*16 columns c (v: address of row 0's first f16 column;
    v_row: bytes between rows; acc f32 rows acc_stride floats apart, loaded once and stored once)."""
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

    def body(b: ir.IRBuilder, j: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        row = b.add(v_a, b.mul(j, v_row))
        vs = [_load_f16x16(b, b.add(row, ir.Constant(_I64, 2 * LANES * c))) for c in range(n_vec)]
        new = []
        for g in range(group):
            w = _splat(b, b.load(b.gep(w_rows[g], [j])))
            new += [b.call(fma, [w, vs[c], accs[g * n_vec + c]]) for c in range(n_vec)]
        return new

    for p, v in zip(acc_ptrs, _counted_loop(b, fn, n, init, body), strict=True):
        b.store(v, p, align=4)
    b.ret_void()
    return fn


def _pv_vectors(group: int) -> int:
    return 4 if group <= 6 else 2  # group * n_vec accumulators + n_vec rows stay within 32 registers


# qk(group, ...) / pv(group, ...): one IR variant per GQA group size (its accumulators stay in registers)
_qk_call = switch_intrinsic(
    {g: (f"edgellm_qk_g{g}", lambda m, n, g=g: _build_qk(m, n, g)) for g in range(1, MAX_GROUP + 1)}, 7
)
_pv_call = switch_intrinsic(
    {
        g: (f"edgellm_pv_g{g}", lambda m, n, g=g: _build_pv(m, n, g, _pv_vectors(g)))
        for g in range(1, MAX_GROUP + 1)
    },
    7,
)


@njit(cache=True, nogil=True)
def _f16_round_unit_inplace(a: np.ndarray) -> None:
    """Round values in [0, 1] to float16 values (ties to even) without branches, so the loops vectorise:
    below 2^-14 (f16 subnormals, a fixed step of 2^-24) rint on the value scaled by 2^24 (exact power-of-2
    scalings: no fast-math rewrite can change it, unlike an (x + 0.5) - 0.5 trick, which LLVM folded away
    once inlined into a fast-math caller); above, the integer rounding of f16_round_inplace."""
    for i in range(a.shape[0]):
        x = a[i]
        a[i] = np.rint(x * np.float32(16777216.0)) * np.float32(2.0**-24) if x < np.float32(2.0**-14) else x
    bits = a.view(np.uint32)
    for i in range(a.shape[0]):
        b = bits[i]
        r = (b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
        bits[i] = r if b >= np.uint32(0x38800000) else b


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _softmax_f16_row(s: np.ndarray) -> None:
    """In place: s = f16(softmax(s)) as ggml's soft_max (f32 exps, float64 sum, f32 scale by 1/sum),
    then the f16 rounding llama.cpp applies before multiplying V."""
    m = np.float32(-np.inf)
    for j in range(s.shape[0]):
        m = max(m, s[j])
    for j in range(s.shape[0]):
        s[j] = s[j] - m
    for j in range(s.shape[0]):
        # libm's expf, as llama.cpp's CPU attention: a vectorised polynomial exp (ggml_v_expf) was ~30%
        # faster here but flipped one of 122 teacher-forced Gemma 3 tokens against llama.cpp.
        s[j] = np.exp(s[j])
    total = 0.0  # float64 sum of the float32 exps
    for j in range(s.shape[0]):
        total += s[j]
    inv = np.float32(1.0 / total)
    for j in range(s.shape[0]):
        s[j] *= inv
    _f16_round_unit_inplace(s)


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _qk_loop(qh, k_cache, blk, kvh, scale, scores, col) -> None:
    """Q.K for one block without the IR kernel (any block size / group): same layout, plain loops."""
    group, d = qh.shape
    bs = k_cache.shape[3]
    for g in range(group):
        for pos in range(bs):
            acc = np.float32(0.0)
            for i in range(d):
                acc += qh[g, i] * f16_bits_to_f32(k_cache[blk, kvh, i, pos])
            scores[g, col + pos] = acc * scale


@njit(cache=True, nogil=True, fastmath=SAFE_MATH)
def _pv_loop(scores, col, n, v_cache, blk, row0, kvh, acc) -> None:
    """P.V over rows row0..row0+n-1 of one block without the IR kernel."""
    group, dv = acc.shape
    for j in range(n):
        for g in range(group):
            w = scores[g, col + j]
            for i in range(dv):
                acc[g, i] += w * f16_bits_to_f32(v_cache[blk, row0 + j, kvh, i])


@njit(cache=True, nogil=True, fastmath=SAFE_MATH, parallel=True)
def attention_paged_cpu(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    tok_seq: np.ndarray,
    tok_pos: np.ndarray,
    window: int,
    scale: float,
    n_threads: int,
    out: np.ndarray,
) -> None:
    """Causal attention for a batch of tokens from different sequences, keys read through block tables.

    q: [T, H, d] (C-contiguous); k_cache: uint16 (f16 bits) [n_blocks, Hkv, d, block_size]; v_cache:
    uint16 [n_blocks, block_size, Hkv, dv]; block_tables: [S, max_blocks] int32; tok_seq[t]: row of
    block_tables for token t; tok_pos[t]: its position. Token t attends to positions
    max(0, pos - window + 1) .. pos of its sequence (window <= 0: no window). out: [T, H, dv].
    Decode tokens and prefill chunks over cached prefixes are the same call.
    """
    T, H, d = q.shape
    n_kv, bs = k_cache.shape[1], k_cache.shape[3]
    dv = v_cache.shape[3]
    group = H // n_kv
    n_vec = 4 if group <= 6 else 2  # attention._pv_vectors
    chunk = n_vec * LANES
    fast = HALF_OPS_NATIVE and bs % LANES == 0 and dv % chunk == 0 and group <= MAX_GROUP and d > 0
    max_pos = 0
    for t in range(T):
        max_pos = max(max_pos, tok_pos[t])
    width = (max_pos // bs + 2) * bs  # scores columns: every block a token can touch
    sbits = np.empty(1, np.float32)
    sbits[0] = scale
    scale_bits = np.int64(sbits.view(np.int32)[0])
    n_items = T * n_kv
    n_runs = min(n_items, n_threads)  # an argument: get_num_threads() inside njit defeats cache=True
    kb0, kb1, kb2 = k_cache.strides[0], k_cache.strides[1], k_cache.strides[2]
    vb0, vb1, vb2 = v_cache.strides[0], v_cache.strides[1], v_cache.strides[2]
    for run in prange(n_runs):
        # scratch once per thread run: allocations per item would cost more than short items
        qh = np.empty((group, d), np.float32)
        scores = np.empty((group, width), np.float32)
        acc = np.empty((group, dv), np.float32)
        for idx in range(run * n_items // n_runs, (run + 1) * n_items // n_runs):
            t = idx // n_kv
            kvh = idx % n_kv
            s = tok_seq[t]
            p = tok_pos[t]
            start = 0
            if window > 0 and p - window + 1 > 0:
                start = p - window + 1
            b0 = start // bs
            nb = p // bs - b0 + 1
            lo = start - b0 * bs  # first attended column of scores
            n = p - start + 1
            for g in range(group):
                for i in range(d):
                    qh[g, i] = q[t, kvh * group + g, i]
                f16_round_inplace(qh[g])  # llama.cpp converts Q to f16 for the Q.K product
            for b in range(nb):
                blk = block_tables[s, b0 + b]
                if fast:
                    for sb in range(bs // LANES):
                        _qk_call(
                            group, qh.ctypes.data, d,
                            k_cache.ctypes.data + blk * kb0 + kvh * kb1 + sb * LANES * 2, kb2,
                            scores.ctypes.data + (b * bs + sb * LANES) * 4, width, scale_bits,
                        )  # fmt: skip
                else:
                    _qk_loop(qh, k_cache, blk, kvh, np.float32(scale), scores, b * bs)
            for g in range(group):
                _softmax_f16_row(scores[g, lo : lo + n])  # f16 weights, as llama.cpp's P.V
            acc[:] = 0.0
            for b in range(nb):
                blk = block_tables[s, b0 + b]
                r0 = lo if b == 0 else 0
                r1 = min(bs, p - (b0 + b) * bs + 1)
                if fast:
                    for c0 in range(0, dv, chunk):
                        _pv_call(
                            group, scores.ctypes.data + (b * bs + r0) * 4, width, r1 - r0,
                            v_cache.ctypes.data + blk * vb0 + r0 * vb1 + kvh * vb2 + c0 * 2, vb1,
                            acc.ctypes.data + c0 * 4, dv,
                        )  # fmt: skip
                else:
                    _pv_loop(scores, b * bs + r0, r1 - r0, v_cache, blk, r0, kvh, acc)
            for g in range(group):
                for i in range(dv):
                    out[t, kvh * group + g, i] = acc[g, i]
