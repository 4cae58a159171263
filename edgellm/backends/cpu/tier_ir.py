"""The instruction-set primitives each CPU tier gives the IR kernels (tiers.py names the tiers).

Every primitive works on the same logical vectors whatever the tier, so one tile layout and one kernel
builder (vnni_ir.py, silu_ir.py) serve them all:
- dot(b, acc, w, x): acc <16 x i32> + per lane the sum of its 4 unsigned weight bytes times its 4 signed
  activation bytes (w, x: <16 x i32> holding 64 bytes), exact. `dot_max` is the largest weight byte it
  is exact for (AVX2's pmaddubsw saturates its int16 pair sums past 127 * 127 * 2).
- signed_dot (where set): the same for signed weight bytes. Layouts storing 8-bit weights with offset
  128 give it their bytes ^ 0x80 (the signed quants) instead of dot with the offset correction.
- pair_dot / pair_widen (where set): dot in two steps, for a tier whose dot is two instructions: pair_dot
  (b, w, x) gives <32 x i16>, per lane the sum of 2 products, and pair_widen(b, acc, pairs) adds each
  lane's 2 pair sums to acc (<16 x i32>). A kernel adds the pair sums of several words with plain int16
  adds first, as long as they cannot overflow (PAIR_SUM_MAX), and widens once: one vpmaddwd per chunk of
  words instead of one per word.
- shuffle(b, table, idx): <64 x i8> byte lookup within each 128-bit lane (pshufb).
- scale2n(b, j, n, n_int): j * 2^n (<16 x float>, n integral; n_int its <16 x i32> value for |n| <= 192)
  with one rounding, as AVX-512's vscalefps computes it.
The float parts of the kernels are generic vector IR, which LLVM legalizes for any target.
"""

from __future__ import annotations

from llvmlite import ir

from edgellm.backends.cpu.ir_basic import declare

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
V16I32, V64I8 = ir.VectorType(_I32, 16), ir.VectorType(_I8, 64)
_V8I32, _V32I8, _V16I16 = ir.VectorType(_I32, 8), ir.VectorType(_I8, 32), ir.VectorType(_I16, 16)
V16F32 = ir.VectorType(ir.FloatType(), 16)


def _halves(b: ir.IRBuilder, v: ir.Value, half_t: ir.VectorType) -> list[ir.Value]:
    """A 64-byte vector as its two 32-byte halves of type half_t."""
    n = half_t.count
    whole = b.bitcast(v, ir.VectorType(half_t.element, 2 * n))
    return [
        b.shuffle_vector(whole, whole, ir.Constant(ir.VectorType(_I32, n), list(range(h * n, (h + 1) * n))))
        for h in (0, 1)
    ]


def _join(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, whole_t: ir.VectorType) -> ir.Value:
    n = lo.type.count
    joined = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n))))
    return b.bitcast(joined, whole_t)


# ---- AVX-512 VNNI: the whole 64-byte vector per instruction ------------------------------------------
def dot_avx512vnni(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    fn = declare(b.module, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32] * 3)
    return b.call(fn, [acc, w, x])


def shuffle_avx512(b: ir.IRBuilder, table: ir.Value, idx: ir.Value) -> ir.Value:
    return b.call(declare(b.module, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8] * 2), [table, idx])


def scale2n_avx512(b: ir.IRBuilder, j: ir.Value, n: ir.Value, n_int: ir.Value) -> ir.Value:
    scalef = declare(b.module, "llvm.x86.avx512.mask.scalef.ps.512", V16F32, [V16F32] * 3 + [_I16, _I32])
    undef = ir.Constant(V16F32, ir.Undefined)
    return b.call(scalef, [j, n, undef, ir.Constant(_I16, -1), ir.Constant(_I32, 4)])  # 4: MXCSR rounding


# ---- 256-bit tiers: two halves -------------------------------------------------------------------------
def dot_avxvnni(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """vpdpbusd on ymm: with avxvnni and without avx512vl LLVM encodes it as VEX ({vex} vpdpbusd)."""
    fn = declare(b.module, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [_V8I32] * 3)
    parts = zip(_halves(b, acc, _V8I32), _halves(b, w, _V8I32), _halves(b, x, _V8I32), strict=True)
    lo, hi = (b.call(fn, list(p)) for p in parts)
    return _join(b, lo, hi, V16I32)


def _madd_pairs(b: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<8 x i32>: per lane the 4 products of unsigned bytes u and signed bytes s (<32 x i8>), summed
    (vpmaddubsw then vpmaddwd with ones; exact while each pair of products fits int16)."""
    pairs = b.call(declare(b.module, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8] * 2), [u, s])
    ones = ir.Constant(_V16I16, [1] * 16)
    return b.call(declare(b.module, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16] * 2), [pairs, ones])


PAIR_SUM_MAX = 32767  # int16: what pair_dot's lanes, and their sums, must stay within
ACTIVATION_MAX = 128  # |int8 activation| at most (they stop at 127; 128 is the type's bound)


def pair_dot_avx2(b: ir.IRBuilder, w: ir.Value, x: ir.Value) -> ir.Value:
    """<32 x i16>: vpmaddubsw of unsigned w and signed x (<16 x i32> each) per 32-byte half."""
    fn = declare(b.module, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [_V32I8] * 2)
    halves = zip(_halves(b, w, _V32I8), _halves(b, x, _V32I8), strict=True)
    lo, hi = (b.call(fn, [wh, xh]) for wh, xh in halves)
    return _join(b, lo, hi, ir.VectorType(_I16, 32))


def pair_widen_avx2(b: ir.IRBuilder, acc: ir.Value, pairs: ir.Value) -> ir.Value:
    """acc + per i32 lane the sum of its 2 int16 pair sums (vpmaddwd with ones per half)."""
    fn = declare(b.module, "llvm.x86.avx2.pmadd.wd", _V8I32, [_V16I16] * 2)
    ones = ir.Constant(_V16I16, [1] * 16)
    lo, hi = (b.call(fn, [h, ones]) for h in _halves(b, pairs, _V16I16))
    return b.add(acc, _join(b, lo, hi, V16I32))


def dot_avx2(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    halves = zip(_halves(b, w, _V32I8), _halves(b, x, _V32I8), strict=True)
    lo, hi = (_madd_pairs(b, wh, xh) for wh, xh in halves)
    return b.add(acc, _join(b, lo, hi, V16I32))


def signed_dot_avx2(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """ggml's sign trick: |w| (unsigned, 128 for -128) times x with w's sign: |w| * x * sgn(w) = w * x,
    and a pair sum is at most 2 * 128 * 127 (activations never reach -128), within int16."""
    absf = declare(b.module, "llvm.abs.v32i8", _V32I8, [_V32I8, ir.IntType(1)])
    sign = declare(b.module, "llvm.x86.avx2.psign.b", _V32I8, [_V32I8] * 2)
    parts = []
    int_min_is_poison = ir.Constant(ir.IntType(1), 0)  # abs(-128) = 0x80: 128 as the unsigned operand
    for wh, xh in zip(_halves(b, w, _V32I8), _halves(b, x, _V32I8), strict=True):
        parts.append(_madd_pairs(b, b.call(absf, [wh, int_min_is_poison]), b.call(sign, [xh, wh])))
    return b.add(acc, _join(b, parts[0], parts[1], V16I32))


def shuffle_avx2(b: ir.IRBuilder, table: ir.Value, idx: ir.Value) -> ir.Value:
    fn = declare(b.module, "llvm.x86.avx2.pshuf.b", _V32I8, [_V32I8] * 2)
    parts = zip(_halves(b, table, _V32I8), _halves(b, idx, _V32I8), strict=True)
    lo, hi = (b.call(fn, list(p)) for p in parts)
    return _join(b, lo, hi, V64I8)


def scale2n_generic(b: ir.IRBuilder, j: ir.Value, n: ir.Value, n_int: ir.Value) -> ir.Value:
    """vscalefps's j * 2^n in two exact-power multiplies: 2^n1 then 2^n2, n1 = n >> 1, n2 = n - n1 (both
    within +-96, normal floats). j is near 1, so j * 2^n1 is exact and only the second product rounds, as
    the single rounding of vscalefps (subnormal and overflowing results included). Where |n| > 192 the
    caller's select replaces the result; NaN in j stays NaN."""
    n1 = b.ashr(n_int, ir.Constant(V16I32, [1] * 16))
    n2 = b.sub(n_int, n1)
    bias, shift = ir.Constant(V16I32, [127] * 16), ir.Constant(V16I32, [23] * 16)
    p1, p2 = (b.bitcast(b.shl(b.add(k, bias), shift), V16F32) for k in (n1, n2))
    return b.fmul(b.fmul(j, p1), p2)


# ---- ARM NEON with dotprod: four 16-byte quarters ------------------------------------------------------
_V4I32, _V16I8 = ir.VectorType(_I32, 4), ir.VectorType(_I8, 16)


def _quarters(b: ir.IRBuilder, v: ir.Value, part_t: ir.VectorType) -> list[ir.Value]:
    n = part_t.count
    whole = b.bitcast(v, ir.VectorType(part_t.element, 4 * n))
    mask = lambda q: ir.Constant(ir.VectorType(_I32, n), list(range(q * n, (q + 1) * n)))  # noqa: E731
    return [b.shuffle_vector(whole, whole, mask(q)) for q in range(4)]


def _join4(b: ir.IRBuilder, parts: list[ir.Value], whole_t: ir.VectorType) -> ir.Value:
    pair_t = ir.VectorType(parts[0].type.element, 2 * parts[0].type.count)
    lo, hi = (_join(b, parts[i], parts[i + 1], pair_t) for i in (0, 2))
    return _join(b, lo, hi, whole_t)


def signed_dot_neon(b: ir.IRBuilder, acc: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
    """sdot: signed x signed bytes, 4 products a lane; also `dot` for weights below 128 (the same bytes
    read as signed)."""
    fn = declare(b.module, "llvm.aarch64.neon.sdot.v4i32.v16i8", _V4I32, [_V4I32, _V16I8, _V16I8])
    parts = zip(_quarters(b, acc, _V4I32), _quarters(b, w, _V16I8), _quarters(b, x, _V16I8), strict=True)
    return _join4(b, [b.call(fn, list(p)) for p in parts], V16I32)


def shuffle_neon(b: ir.IRBuilder, table: ir.Value, idx: ir.Value) -> ir.Value:
    """tbl1 per 16 bytes (the table repeats in each, as for pshufb; indices are below 16)."""
    fn = declare(b.module, "llvm.aarch64.neon.tbl1.v16i8", _V16I8, [_V16I8, _V16I8])
    parts = zip(_quarters(b, table, _V16I8), _quarters(b, idx, _V16I8), strict=True)
    return _join4(b, [b.call(fn, list(p)) for p in parts], V64I8)
