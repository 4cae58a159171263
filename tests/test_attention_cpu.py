"""CPU paged attention against a float64 numpy reference over (GQA group, head size, block size, window),
with prefill chunks over cached prefixes and decode tokens of other sequences in one call, NaN guard regions
around the output, batch invariance, and the f16 rounding helpers it relies on."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from edgellm.backends.cpu.attention import _f16_round_unit_inplace, attention_paged_cpu
from edgellm.backends.cpu.fp16 import f16_round_inplace
from edgellm.backends.cpu.ops import write_kv_cpu

GUARD = 2


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def make_case(group: int, d: int, bs: int, rng: np.random.Generator):
    """Three sequences: one with a 5-token prefill chunk over a cached prefix, two decoding one token."""
    n_kv, n_blocks = 2, 40
    lengths = [23, 9, 40]  # tokens in the cache after this step, per sequence
    k_cache = np.zeros((n_blocks, n_kv, d, bs), np.uint16)  # f16 bits, as CpuBackend.alloc_kv
    v_cache = np.zeros((n_blocks, bs, n_kv, d), np.uint16)
    perm = rng.permutation(n_blocks)  # blocks out of order, as the block manager hands them out
    tables, seq_k, seq_v, used = [], [], [], 0
    for n in lengths:
        nb = -(-n // bs)
        tables.append(perm[used : used + nb])
        used += nb
        k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
        slots = np.array([tables[-1][p // bs] * bs + p % bs for p in range(n)], np.int64)
        write_kv_cpu(k, v, k_cache, v_cache, slots)
        seq_k.append(_f16(k))
        seq_v.append(_f16(v))
        # the cache holds exactly numpy's f16 conversion, K transposed per block
        assert k_cache[slots[5] // bs, 1, :, slots[5] % bs].tobytes() == k[5, 1].astype(np.float16).tobytes()
        assert v_cache[slots[-1] // bs, slots[-1] % bs, 0].tobytes() == v[-1, 0].astype(np.float16).tobytes()
    block_tables = np.zeros((3, max(len(t) for t in tables)), np.int32)
    for s, t in enumerate(tables):
        block_tables[s, : len(t)] = t
    tok_seq = np.array([0, 0, 0, 0, 0, 1, 2], np.int32)
    tok_pos = np.array([18, 19, 20, 21, 22, 8, 39], np.int32)
    q = (rng.standard_normal((len(tok_seq), n_kv * group, d)) * 2).astype(np.float32)
    return q, k_cache, v_cache, block_tables, tok_seq, tok_pos, seq_k, seq_v


def reference(q, tok_seq, tok_pos, seq_k, seq_v, window: int, scale: float) -> np.ndarray:
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
            x = k @ _f16(q[t, h]).astype(np.float64) * scale
            w = np.exp(x - x.max())
            out[t, h] = (w / w.sum()) @ v
    return out


@pytest.mark.parametrize(
    "group,d,bs,window",
    [
        (3, 64, 16, 0),  # SmolLM2's shape, IR kernels
        (4, 256, 16, 0),  # Gemma 3 270M's shape
        (4, 256, 16, 5),  # its sliding-window layers (window smaller than a block)
        (1, 64, 32, 20),  # no GQA, 32-token blocks, window across blocks
        (8, 128, 16, 0),  # group of 8: the narrower P.V chunk
        (9, 64, 16, 0),  # group above the IR kernels: Numba loops
        (2, 48, 16, 0),  # head size not a multiple of the P.V chunk: Numba loops
        (3, 64, 4, 7),  # block size not a multiple of 16: Numba loops
    ],
)
def test_attention_matches_reference(group: int, d: int, bs: int, window: int) -> None:
    rng = np.random.default_rng(group * 1000 + d + bs + window)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, seq_k, seq_v = make_case(group, d, bs, rng)
    T, H, _ = q.shape
    buf = np.full((T + 2 * GUARD, H + 2 * GUARD, d + 2 * GUARD), np.nan, np.float32)
    out = buf[GUARD:-GUARD, GUARD:-GUARD, GUARD:-GUARD]
    scale = 1.0 / np.sqrt(d)
    attention_paged_cpu(
        q, k_cache, v_cache, tables, tok_seq, tok_pos, window, scale, numba.get_num_threads(), out
    )
    mask = np.ones(buf.shape, bool)
    mask[GUARD:-GUARD, GUARD:-GUARD, GUARD:-GUARD] = False
    assert np.isnan(buf[mask]).all(), "attention wrote outside its output"
    ref = reference(q, tok_seq, tok_pos, seq_k, seq_v, window, scale)
    nmse = ((out - ref) ** 2).sum() / (ref**2).sum()
    assert nmse < 1e-6, f"NMSE {nmse:.2e}"  # f16 softmax weights: ~1e-8 expected


def test_attention_is_batch_invariant() -> None:
    """Each token's output is bit-identical whether it is computed with the whole batch or alone, on any
    number of threads."""
    rng = np.random.default_rng(11)
    q, k_cache, v_cache, tables, tok_seq, tok_pos, *_ = make_case(3, 64, 16, rng)
    full = np.empty_like(q)
    attention_paged_cpu(q, k_cache, v_cache, tables, tok_seq, tok_pos, 0, 0.125, 2, full)
    for t in range(q.shape[0]):
        one = np.empty_like(q[t : t + 1])
        attention_paged_cpu(q[t : t + 1], k_cache, v_cache, tables, tok_seq[t : t + 1], tok_pos[t : t + 1], 0,
                            0.125, 1, one)  # fmt: skip
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
