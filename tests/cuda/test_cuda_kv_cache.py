"""The CUDA KV cache: K/V written from strided views hold the f16 / q8_0 reference bits, paged attention
over them matches a float64 reference, and the fused RoPE + KV write gives the plain kernels' bits.

Runs where test_cuda_backend.py's cases run: in its simulator subprocess (NUMBA_ENABLE_CUDASIM=1) or on a
GPU with EDGELLM_CUDA_TESTS=gpu.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.gguf.rope import RopeParams
from edgellm.testing.cuda.guards import BE, guarded, guards_intact
from edgellm.testing.kernel_refs import nmse
from edgellm.testing.rope_ref import scaled_rope


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_cuda_kv_write_and_attention_match_reference(dtype: str) -> None:
    """K/V written from strided views of a guarded QKV buffer hold the table's reference bits (f16, or
    q8_0 values and scales: ggml's rounding, ties included), blocks not written stay zero, and paged
    attention over them (a 3-token prefill chunk over a cached prefix next to another sequence's decode,
    blocks out of order) matches a float64 reference on the values the cache holds; the output's guards
    stay NaN."""
    from edgellm.quants.kv_cache import get_kv_cache_type

    kvt = get_kv_cache_type(dtype)
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    n_kv, group, d, bs, n_blocks = 1, 2, 32, 4, 6
    H = n_kv * group
    lengths, tables = [6, 3], [[4, 1], [2]]  # tokens cached per sequence after this step; its blocks
    pos = [p for n in lengths for p in range(n)]
    seq = [s for s, n in enumerate(lengths) for _ in range(n)]
    slots = np.array([tables[s][p // bs] * bs + p % bs for s, p in zip(seq, pos, strict=True)], np.int64)
    qkv = rng.standard_normal((len(pos), (H + 2 * n_kv) * d)).astype(np.float32)
    qkv[0, H * d : H * d + 32] = np.arange(32) - np.float32(15.5)  # K head 0 of token 0: .5 ties
    qkv[0, H * d] = 127.0  # amax 127: x * 127/amax = x
    whole, view = guarded(qkv)
    k_view = view[:, H * d : (H + n_kv) * d].reshape(len(pos), n_kv, d)
    v_view = view[:, (H + n_kv) * d :].reshape(len(pos), n_kv, d)
    kv = BE.alloc_kv(1, n_blocks, bs, n_kv, d, d, dtype)
    BE.write_kv(kv, 0, k_view, v_view, BE.from_host(slots))
    k = qkv[:, H * d : (H + n_kv) * d].reshape(-1, n_kv, d)
    v = qkv[:, (H + n_kv) * d :].reshape(-1, n_kv, d)
    lay = kv.layers[0]
    for values, scales, x in ((lay.k, lay.k_scale, k), (lay.v, lay.v_scale, v)):
        got = BE.to_host(values)
        want_q, want_d = kvt.quantize_ref(x)
        flat = got.reshape(n_blocks * bs, n_kv, d)
        np.testing.assert_array_equal(flat[slots].view(want_q.dtype), want_q)
        if kvt.block > 1:
            got_d = BE.to_host(scales).reshape(n_blocks * bs, n_kv, d // 32)
            np.testing.assert_array_equal(got_d[slots].astype(np.float32), want_d)
        untouched = np.setdiff1d(np.arange(n_blocks * bs), slots)
        assert not flat[untouched].any(), "the writer touched other slots"
    k_held, v_held = kvt.dequantize_ref(*kvt.quantize_ref(k)), kvt.dequantize_ref(*kvt.quantize_ref(v))
    tok_seq = np.array([0, 0, 0, 1], np.int32)  # the last 3 tokens of sequence 0, the last of 1
    tok_pos = np.array([3, 4, 5, 2], np.int32)
    block_tables = np.array([[4, 1], [2, 0]], np.int32)
    q = rng.standard_normal((4, H, d)).astype(np.float32)
    o_whole, out = guarded(np.full((4, H * d), np.nan, np.float32))
    scale = 1 / np.sqrt(d)
    BE.attention(
        BE.from_host(q), kv, 0, BE.from_host(block_tables), BE.from_host(tok_seq), BE.from_host(tok_pos),
        0, scale, out.reshape(4, H, d),
    )  # fmt: skip
    got = BE.to_host(out).reshape(4, H, d)
    assert guards_intact(o_whole, (4, H * d))
    ref = np.zeros((4, H, d))
    starts = [0, 6]  # row of each sequence's first token in k_held / v_held
    for t in range(4):
        rows = slice(starts[tok_seq[t]], starts[tok_seq[t]] + tok_pos[t] + 1)
        for h in range(H):
            kk, vv = k_held[rows, h // group].astype(np.float64), v_held[rows, h // group]
            x = kk @ q[t, h].astype(np.float16).astype(np.float64) * scale
            w = np.exp(x - x.max())
            ref[t, h] = (w / w.sum()) @ vv
    assert nmse(got, ref) < 1e-6


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_cuda_fused_rope_kv_write_gives_the_plain_bits(dtype: str, scaled: bool) -> None:
    """RoPE of Q and K then the KV write, fused into one kernel (K quantized once its head is rotated) and
    plain: the same cache bits and the same rotated Q."""
    rng = np.random.default_rng(3)
    n_kv, H, d, T = 2, 2, 32, 3
    qkv = rng.standard_normal((T, (H + 2 * n_kv) * d)).astype(np.float32)
    pos, slots = BE.from_host(np.array([0, 5, 9], np.int32)), BE.from_host(np.array([1, 6, 11], np.int64))
    results = []
    for fuse in (False, True):
        BE.fuse = fuse
        BE.stats.reset()
        x = BE.from_host(qkv)
        q = x[:, : H * d].reshape(T, H, d)
        k = x[:, H * d : (H + n_kv) * d].reshape(T, n_kv, d)
        v = x[:, (H + n_kv) * d :].reshape(T, n_kv, d)
        kv = BE.alloc_kv(1, 3, 4, n_kv, d, d, dtype)
        rope = scaled_rope(d) if scaled else RopeParams(n_rot=d, neox=True)
        BE.rope(q, pos, rope)
        BE.rope(k, pos, rope)
        BE.write_kv(kv, 0, k, v, slots)
        caches = [BE.to_host(a) for a in kv.layers[0].blocks]
        results.append((caches, BE.to_host(x), dict(BE.stats.launches)))
    BE.fuse = True
    (plain_kv, plain_x, plain_n), (fused_kv, fused_x, fused_n) = results
    assert fused_n == {"heads_rope_kv_cuda": 1} and "heads_rope_kv_cuda" not in plain_n
    np.testing.assert_array_equal(fused_x, plain_x)
    for a, b in zip(fused_kv, plain_kv, strict=True):
        np.testing.assert_array_equal(a, b)
