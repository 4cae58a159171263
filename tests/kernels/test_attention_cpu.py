"""CPU paged attention against a float64 numpy reference over (KV cache type, GQA group, head size, block
size, window), with prefill chunks over cached prefixes and decode tokens of other sequences in one call, NaN
guard regions around the output, batch invariance, the KV writers (the exact bits of the references, and
nothing outside their slots), no read past the block tables, and the f16 rounding helpers they rely on."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numba
import numpy as np
import pytest

from edgellm.backends.cpu.attention import _f16_round_unit_inplace, attention_paged_cpu
from edgellm.backends.cpu.fp16 import f16_bits, f16_round_inplace
from edgellm.backends.cpu.kv_cache import CPU_KV_KERNELS
from edgellm.backends.cpu.ops import write_kv_cpu
from edgellm.quants.kv_cache import get_kv_cache_type

GUARD = 2
NO_SINKS = np.empty(0, np.float32)


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def q8_0_bytes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml block_q8_0 bytes of x [..., n] from the table's reference: (scale bytes [..., n/32, 2], value
    bytes [..., n/32, 32])."""
    q, d = get_kv_cache_type("q8_0").quantize_ref(x)
    qb = q.view(np.uint8).reshape(*q.shape[:-1], -1, 32)
    return d.astype(np.float16).view(np.uint8).reshape(*d.shape, 2), qb


def check_cache_holds(dtype: str, k_cache, v_cache, k, v, slots, bs: int) -> None:  # noqa: ANN001
    """The cache holds exactly the reference's bits at each slot (K transposed per block)."""
    for t, slot in enumerate(slots):
        blk, off = slot // bs, slot % bs
        if dtype == "f16":
            assert k_cache[blk, :, :, off].tobytes() == k[t].astype(np.float16).tobytes()
            assert v_cache[blk, off].tobytes() == v[t].astype(np.float16).tobytes()
            continue
        ks, kq = q8_0_bytes(k[t])  # [Hkv, d/32, 2], [Hkv, d/32, 32]
        np.testing.assert_array_equal(k_cache[blk, :, :, 2:, off], kq)
        scales = k_cache[blk, :, :, :2].reshape(*k_cache.shape[1:3], 2 * bs)
        np.testing.assert_array_equal(scales[:, :, 2 * off : 2 * off + 2], ks)
        vs, vq = q8_0_bytes(v[t])
        np.testing.assert_array_equal(v_cache[blk, off], np.concatenate([vs, vq], axis=-1))


def make_case(group: int, d: int, bs: int, rng: np.random.Generator, dtype: str = "f16"):
    """Three sequences: one with a 5-token prefill chunk over a cached prefix, two decoding one token."""
    n_kv, n_blocks = 2, 40
    lengths = [23, 9, 40]  # tokens in the cache after this step, per sequence
    kernels, kvt = CPU_KV_KERNELS[dtype], get_kv_cache_type(dtype)
    k_cache, v_cache = kernels.alloc(n_blocks, bs, n_kv, d, d)  # as CpuBackend.alloc_kv
    perm = rng.permutation(n_blocks)  # blocks out of order, as the block manager hands them out
    tables, seq_k, seq_v, used = [], [], [], 0
    for n in lengths:
        nb = -(-n // bs)
        tables.append(perm[used : used + nb])
        used += nb
        k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        slots = np.array([tables[-1][p // bs] * bs + p % bs for p in range(n)], np.int64)
        kernels.write(k, v, k_cache, v_cache, slots)
        seq_k.append(kvt.dequantize_ref(*kvt.quantize_ref(k)))  # what the cache holds
        seq_v.append(kvt.dequantize_ref(*kvt.quantize_ref(v)))
        some = [0, 5, n - 1]
        check_cache_holds(dtype, k_cache, v_cache, k[some], v[some], slots[some], bs)
    block_tables = np.zeros((3, max(len(t) for t in tables)), np.int32)
    for s, t in enumerate(tables):
        block_tables[s, : len(t)] = t
    tok_seq = np.array([0, 0, 0, 0, 0, 1, 2], np.int32)
    tok_pos = np.array([18, 19, 20, 21, 22, 8, 39], np.int32)
    q = (rng.standard_normal((len(tok_seq), n_kv * group, d)) * 2).astype(np.float32)
    return q, k_cache, v_cache, block_tables, tok_seq, tok_pos, seq_k, seq_v


def reference(
    q, tok_seq, tok_pos, seq_k, seq_v, window: int, scale: float, softcap: float = 0.0, sinks=None
) -> np.ndarray:
    """softcap > 0: Q scaled before its f16 rounding, the scores capped to cap * tanh(s / cap) (Gemma 2).
    sinks [H]: head h's softmax has one more logit sinks[h], in its denominator only (gpt-oss)."""
    T, H, d = q.shape
    n_kv = seq_k[0].shape[1]
    group = H // n_kv
    out = np.zeros((T, H, d))
    for t in range(T):
        s, p = tok_seq[t], tok_pos[t]
        start = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            k = seq_k[s][start : p + 1, h // group].astype(np.float64)
            v = seq_v[s][start : p + 1, h // group].astype(np.float64)
            if softcap > 0:
                x = k @ _f16(q[t, h] * np.float32(scale)).astype(np.float64)
                x = softcap * np.tanh(x / softcap)
            else:
                x = k @ _f16(q[t, h]).astype(np.float64) * scale
            sink = -np.inf if sinks is None else float(sinks[h])
            m = max(x.max(), sink)
            w = np.exp(x - m)
            out[t, h] = (w / (w.sum() + np.exp(sink - m))) @ v
    return out


CASES = [
    ("f16", 3, 64, 16, 0),  # SmolLM2's shape, IR kernels
    ("f16", 4, 256, 16, 0),  # Gemma 3 270M's shape
    ("f16", 4, 256, 16, 5),  # its sliding-window layers (window smaller than a block)
    ("f16", 1, 64, 32, 20),  # no GQA, 32-token blocks, window across blocks
    ("f16", 8, 128, 16, 0),  # group of 8: the narrower P.V chunk
    ("f16", 9, 64, 16, 0),  # group above the IR kernels: Numba loops
    ("f16", 2, 48, 16, 0),  # head size not a multiple of the P.V chunk: Numba loops
    ("f16", 3, 64, 4, 7),  # block size not a multiple of 16: Numba loops
    ("q8_0", 3, 64, 16, 0),  # q8_0 IR kernels, two scale blocks per head
    ("q8_0", 4, 256, 16, 5),
    ("q8_0", 1, 64, 32, 20),
    ("q8_0", 8, 128, 16, 0),  # narrower P.V chunk: one q8_0 block per chunk
    ("q8_0", 9, 64, 16, 0),  # Numba loops over q8_0 blocks
    ("q8_0", 3, 64, 4, 7),  # block size 4: scales span both scale rows of a block; Numba loops
    ("q8_0", 1, 32, 16, 0),  # one q8_0 block per head, narrower than the P.V chunk: Numba loops
]


@pytest.mark.parametrize("dtype,group,d,bs,window", CASES)
def test_attention_matches_reference(dtype: str, group: int, d: int, bs: int, window: int) -> None:
    rng = np.random.default_rng(group * 1000 + d + bs + window)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, seq_k, seq_v = make_case(group, d, bs, rng, dtype)
    T, H, _ = q.shape
    buf = np.full((T + 2 * GUARD, H + 2 * GUARD, d + 2 * GUARD), np.nan, np.float32)
    out = buf[GUARD:-GUARD, GUARD:-GUARD, GUARD:-GUARD]
    scale = 1.0 / np.sqrt(d)
    attention_paged_cpu(
        q, k_cache, v_cache, tables, tok_seq, tok_pos, window, scale, 0.0, NO_SINKS, numba.get_num_threads(),
        out,
    )
    mask = np.ones(buf.shape, bool)
    mask[GUARD:-GUARD, GUARD:-GUARD, GUARD:-GUARD] = False
    assert np.isnan(buf[mask]).all(), "attention wrote outside its output"
    ref = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale)
    nmse = ((out - ref) ** 2).sum() / (ref**2).sum()
    assert nmse < 1e-6, f"NMSE {nmse:.2e}"  # f16 softmax weights: ~1e-8 expected


SOFTCAP_CASES = [("f16", 3, 64, 16, 0), ("f16", 4, 256, 16, 5), ("f16", 9, 64, 16, 0), ("q8_0", 3, 64, 16, 0),
                 ("q8_0", 3, 64, 4, 7)]  # fmt: skip


@pytest.mark.parametrize("dtype,group,d,bs,window", SOFTCAP_CASES)
def test_attention_softcap_matches_reference(dtype: str, group: int, d: int, bs: int, window: int) -> None:
    """Gemma 2's attention logit soft-capping on the IR kernels and the Numba loops, f16 and q8_0 caches: a
    cap small enough (1.5) that most scores are squashed, so a kernel that skipped it fails."""
    rng = np.random.default_rng(group * 1000 + d + bs + window + 7)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, seq_k, seq_v = make_case(group, d, bs, rng, dtype)
    out = np.empty((q.shape[0], q.shape[1], d), np.float32)
    scale, cap = 1.0 / np.sqrt(d), 1.5
    attention_paged_cpu(q, k_cache, v_cache, tables, tok_seq, tok_pos, window, scale, cap, NO_SINKS, 2, out)
    ref = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale, cap)
    nmse = ((out - ref) ** 2).sum() / (ref**2).sum()
    assert nmse < 1e-6, f"NMSE {nmse:.2e}"
    uncapped = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale)
    assert ((uncapped - ref) ** 2).sum() / (ref**2).sum() > 1e-3  # the cap matters at this size


SINK_CASES = [("f16", 3, 64, 16, 0), ("f16", 8, 64, 16, 5), ("f16", 9, 64, 16, 0), ("q8_0", 3, 64, 16, 0),
              ("q8_0", 3, 64, 4, 7)]  # fmt: skip


@pytest.mark.parametrize("dtype,group,d,bs,window", SINK_CASES)
def test_attention_sinks_match_reference(dtype: str, group: int, d: int, bs: int, window: int) -> None:
    """gpt-oss's attention sinks (one extra logit per head in the softmax's denominator) on the IR kernels
    and the Numba loops, with and without a window; sinks large enough to take most of the weight of
    some heads, so a kernel that dropped them fails."""
    rng = np.random.default_rng(group * 1000 + d + bs + window + 13)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, seq_k, seq_v = make_case(group, d, bs, rng, dtype)
    sinks = rng.uniform(-2.0, 4.0, q.shape[1]).astype(np.float32)
    out = np.empty((q.shape[0], q.shape[1], d), np.float32)
    scale = 1.0 / np.sqrt(d)
    attention_paged_cpu(q, k_cache, v_cache, tables, tok_seq, tok_pos, window, scale, 0.0, sinks, 2, out)
    ref = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale, sinks=sinks)
    nmse = ((out - ref) ** 2).sum() / (ref**2).sum()
    assert nmse < 1e-6, f"NMSE {nmse:.2e}"
    plain = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale)
    assert ((plain - ref) ** 2).sum() / (ref**2).sum() > 1e-2  # the sinks matter at this size


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_attention_is_batch_invariant(dtype: str) -> None:
    """Each token's output is bit-identical whether it is computed with the whole batch or alone, on any
    number of threads."""
    rng = np.random.default_rng(11)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, *_ = make_case(3, 64, 16, rng, dtype)
    full = np.empty_like(q)
    attention_paged_cpu(q, k_cache, v_cache, tables, tok_seq, tok_pos, 0, 0.125, 0.0, NO_SINKS, 2, full)
    for t in range(q.shape[0]):
        one = np.empty_like(q[t : t + 1])
        attention_paged_cpu(q[t : t + 1], k_cache, v_cache, tables, tok_seq[t : t + 1], tok_pos[t : t + 1], 0,
                            0.125, 0.0, NO_SINKS, 1, one)  # fmt: skip
        np.testing.assert_array_equal(one[0], full[t], err_msg=f"token {t}")


def test_f16_round_unit_matches_numpy_float16() -> None:
    """The branch-free rounding of softmax weights equals numpy's float16 conversion on [0, 1], including
    f16 subnormals, exact ties and the normal/subnormal boundary."""
    rng = np.random.default_rng(3)
    tiny = np.float32(2.0**-24)
    a = np.concatenate(
        [
            rng.random(20000, dtype=np.float32),
            rng.random(20000, dtype=np.float32) * np.float32(2.0**-13),  # around and below 2^-14
            np.arange(0, 3000, dtype=np.float32) * (tiny / 2),  # every subnormal tie
            np.array([0.0, 1.0, 2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-25, 2.0**-26, 1 - 2.0**-12], np.float32),
        ]
    )
    got = a.copy()
    _f16_round_unit_inplace(got)
    np.testing.assert_array_equal(got, _f16(a))
    general = a.copy()
    f16_round_inplace(general)
    np.testing.assert_array_equal(general, got)


def test_kv_write_paths_store_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The F16C path (conversion inside the scatter) and the numpy-cast path store identical caches,
    equal to numpy's float16 conversion, for strided K/V views (as the model passes them)."""
    from edgellm.backends.cpu import ops

    rng = np.random.default_rng(4)
    qkv = (rng.standard_normal((5, 3 * 2 * 16)) * 1e3).astype(np.float32)
    qkv[0, :4] = [0.0, 1e-8, 7e4, -3e-6]  # f16 zero, subnormal, overflow to inf, negative subnormal
    k = qkv[:, :32].reshape(5, 2, 16)
    v = qkv[:, 32:64].reshape(5, 2, 16)
    slots = np.array([3, 17, 18, 40, 0])
    caches = []
    for f16c in (True, False) if ops.HOST_F16C else (False,):
        monkeypatch.setattr(ops, "HOST_F16C", f16c)
        kc, vc = np.zeros((4, 2, 16, 16), np.uint16), np.zeros((4, 16, 2, 16), np.uint16)
        write_kv_cpu(k, v, kc, vc, slots)
        caches.append((kc, vc))
    with np.errstate(over="ignore"):
        want_k, want_v = k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    for kc, vc in caches:
        for t, s in enumerate(slots):
            np.testing.assert_array_equal(kc[s // 16, :, :, s % 16], want_k[t])
            np.testing.assert_array_equal(vc[s // 16, s % 16], want_v[t])


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_kv_writers_touch_only_their_slots(dtype: str) -> None:
    """Every byte of the cache outside the written slots keeps its value (a filled cache as the guard), and
    q8_0 stores ggml's rounding on special blocks: all zeros, exact ties (to even), a single nonzero value."""
    rng = np.random.default_rng(5)
    bs, n_kv, d = 16, 2, 64
    kernels = CPU_KV_KERNELS[dtype]
    before = [np.full(a.shape, 0xA5, a.dtype) for a in kernels.alloc(3, bs, n_kv, d, d)]
    k_cache, v_cache = (a.copy() for a in before)
    qkv = rng.standard_normal((3, 3 * n_kv * d)).astype(np.float32)  # strided K/V views, as the model's
    qkv[0, :32] = 0.0
    qkv[1, :32] = np.arange(32) - np.float32(15.5)  # with amax 127 below, x * 127/amax = x: .5 ties
    qkv[1, 0] = 127.0
    qkv[2, :32] = 0.0
    qkv[2, 7] = -3.0
    k = qkv[:, : n_kv * d].reshape(3, n_kv, d)
    v = qkv[:, n_kv * d : 2 * n_kv * d].reshape(3, n_kv, d)
    slots = np.array([17, 0, 47])  # block 1 offset 1, block 0 offset 0, block 2 offset 15
    kernels.write(k, v, k_cache, v_cache, slots)
    check_cache_holds(dtype, k_cache, v_cache, k, v, slots, bs)
    for cache, old, written in ((k_cache, before[0], "k"), (v_cache, before[1], "v")):
        mask = np.ones(cache.shape, bool)
        for s in slots:
            if written == "v":
                mask[s // bs, s % bs] = False
            elif dtype == "f16":
                mask[s // bs, :, :, s % bs] = False
            else:  # q8_0 K: the values column and the two scale bytes of the slot
                mask[s // bs, :, :, 2:, s % bs] = False
                flat = mask[s // bs, :, :, :2].reshape(n_kv, d // 32, 2 * bs)
                flat[:, :, 2 * (s % bs) : 2 * (s % bs) + 2] = False
                mask[s // bs, :, :, :2] = flat.reshape(n_kv, d // 32, 2, bs)
        np.testing.assert_array_equal(cache[mask], old[mask], err_msg=f"{dtype} {written}: outside its slots")


def test_f16_bits_matches_numpy() -> None:
    """The portable f32 -> f16 bits of the q8_0 scales: every class of value, ties to even."""
    rng = np.random.default_rng(6)
    exps = rng.integers(-30, 18, 20000).astype(np.float32)
    a = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32) * np.float32(2.0) ** exps,
            np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65520, 65519.99, 2.0**-24, 2.0**-25, 3 * 2.0**-26,
                      2.0**-14, 1 + 2.0**-11, 1 + 3 * 2.0**-11], np.float32),
        ]
    ).astype(np.float32)  # fmt: skip
    with np.errstate(over="ignore"):
        want = a.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(np.array([f16_bits(x) for x in a], np.uint16), want)


def _table_before_unreadable_page(rows: np.ndarray) -> tuple[np.ndarray, mmap.mmap]:
    """rows (int32 [S, W]) copied so that the table's last entry ends a page and the next page cannot be
    read (mprotect PROT_NONE): a kernel reading past the table faults. Returns the table and its mapping
    (keep both alive)."""
    page = mmap.PAGESIZE
    n_pages = -(-rows.nbytes // page) + 1
    buf = mmap.mmap(-1, n_pages * page)
    libc = ctypes.CDLL(None, use_errno=True)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(ctypes.c_void_p(base + (n_pages - 1) * page), ctypes.c_size_t(page), 0) == 0
    table = np.frombuffer(buf, np.int32, rows.size, (n_pages - 1) * page - rows.nbytes).reshape(rows.shape)
    table[:] = rows
    return table, buf


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through ctypes: Linux")
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_attention_reads_only_the_block_table_entries_it_attends(window: int, n_threads: int) -> None:
    """The driver asks for blocks ahead of the one it reads (and the next item's first ones): it must
    take those block ids only from the entries the items attend. Block tables exactly as wide as the
    widest sequence, the last row's last entry against an unreadable page, and sequences of fewer blocks
    than the driver looks ahead: an entry read past them faults (a crash of this test)."""
    bs, d, group, n_kv = 16, 64, 4, 2
    rng = np.random.default_rng(5 + window + n_threads)
    kernels, kvt = CPU_KV_KERNELS["f16"], get_kv_cache_type("f16")
    k_cache, v_cache = kernels.alloc(12, bs, n_kv, d, d)
    lengths = [11, 26, 41]  # positions 10, 25, 40: 1, 2 and 3 blocks
    width = -(-max(lengths) // bs)
    rows = np.zeros((len(lengths), width), np.int32)
    seq_k, seq_v, perm = [], [], rng.permutation(12)
    for s, n in enumerate(lengths):
        rows[s, : -(-n // bs)] = perm[s * width : s * width + -(-n // bs)]
        k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        slots = np.array([rows[s, p // bs] * bs + p % bs for p in range(n)], np.int64)
        kernels.write(k, v, k_cache, v_cache, slots)
        seq_k.append(kvt.dequantize_ref(*kvt.quantize_ref(k)))
        seq_v.append(kvt.dequantize_ref(*kvt.quantize_ref(v)))
    table, _mapping = _table_before_unreadable_page(rows)
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):  # the last row first, in the middle, last
        tok_seq = np.array(order, np.int32)
        tok_pos = np.array([lengths[s] - 1 for s in order], np.int32)
        q = rng.standard_normal((len(order), n_kv * group, d)).astype(np.float32)
        out = np.empty_like(q)
        scale = 1.0 / np.sqrt(d)
        attention_paged_cpu(q, k_cache, v_cache, table, tok_seq, tok_pos, window, scale, 0.0, NO_SINKS,
                            n_threads, out)  # fmt: skip
        ref = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale)
        assert ((out - ref) ** 2).sum() / (ref**2).sum() < 1e-6, f"order {order}"
