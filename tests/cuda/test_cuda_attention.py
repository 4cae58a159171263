"""Split-K paged attention on the device (attention.py): tokens with more keys than the backend's
split_keys spread them over several blocks, merged in a fixed order. Checked against the unsplit kernel
(split_keys = 0) and a float64 reference, for bit-identical results whatever else is in the batch and
however wide the block table, and with the fused quantization of the output for the output projection.

Runs where test_cuda_backend.py's cases run (its simulator subprocess, or a GPU with EDGELLM_CUDA_TESTS=gpu).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

if not (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("EDGELLM_CUDA_TESTS") == "gpu"):
    pytest.skip("run by tests/cuda/test_cuda_backend.py in a simulator subprocess", allow_module_level=True)

from edgellm.backends.cuda.attention import _split_plan
from edgellm.backends.cuda.config import ATTN_SPLIT_KEYS, MAX_ATTN_SPLITS
from edgellm.testing.cuda.guards import BE, guarded, guards_intact
from edgellm.testing.kernel_refs import nmse

N_KV, GROUP, D, BS = 1, 2, 32, 16
H = N_KV * GROUP
# Contexts (keys per token): two spread over several splits (one over 128 keys), one short (unsplit)
LONG, SHORT, MID = max(136, 4 * ATTN_SPLIT_KEYS + 8), 6, 2 * ATTN_SPLIT_KEYS + 6
# q8_0 costs ~10 s more in the simulator: on a GPU, or with EDGELLM_CUDA_SIM_FULL=1
FULL = os.environ.get("EDGELLM_CUDA_TESTS") == "gpu" or os.environ.get("EDGELLM_CUDA_SIM_FULL") == "1"


def test_split_plan_depends_on_the_context_only() -> None:
    sk = ATTN_SPLIT_KEYS
    assert _split_plan(sk, sk) == (1, sk) and _split_plan(500, 0) == (1, 500)
    for n in (sk + 1, 2 * sk, 3 * sk + 7, 1000 * sk):
        ns, chunk = _split_plan(n, sk)
        assert 2 <= ns <= MAX_ATTN_SPLITS and (ns - 1) * chunk < n <= ns * chunk  # no empty split
        assert chunk <= sk or ns == MAX_ATTN_SPLITS


class Cache:
    """One layer of KV cache filled with random values (f16, or q8_0 values and scales) for the sequences
    of `lengths`, each over blocks in a shuffled order; the float64 values it holds."""

    def __init__(
        self, dtype: str, lengths: list[int], rng: np.random.Generator, n_kv: int = N_KV, group: int = GROUP,
        d: int = D,
    ) -> None:  # fmt: skip
        self.n_kv, self.group, self.d, self.h = n_kv, group, d, n_kv * group
        widths = [-(-n // BS) for n in lengths]
        n_blocks = sum(widths) + 1
        perm = rng.permutation(n_blocks - 1) + 1  # block 0 stays unused
        self.tables, at = [], 0
        for w in widths:
            self.tables.append(perm[at : at + w].tolist())
            at += w
        self.kv = BE.alloc_kv(1, n_blocks, BS, n_kv, d, d, dtype)
        lay = self.kv.layers[0]
        self.held = []
        for values, scales in ((lay.k, lay.k_scale), (lay.v, lay.v_scale)):
            shape = (n_blocks, BS, n_kv, d)
            if dtype == "f16":
                v = rng.standard_normal(shape).astype(np.float16)
                values.copy_to_device(v)
                self.held.append(v.astype(np.float64))
            else:
                q = rng.integers(-127, 128, shape).astype(np.int8)
                s = (rng.random((*shape[:3], d // 32)) * 0.02 + 0.001).astype(np.float16)
                values.copy_to_device(q)
                scales.copy_to_device(s)
                self.held.append(q.astype(np.float64) * np.repeat(s.astype(np.float64), 32, axis=-1))

    def table(self, seqs: list[int], cols: int) -> np.ndarray:
        t = np.zeros((len(seqs), cols), np.int32)
        for r, s in enumerate(seqs):
            t[r, : len(self.tables[s])] = self.tables[s]
        return t

    def reference(
        self, q: np.ndarray, seq: int, pos: int, scale: float, window: int = 0,
        sinks: np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        """sinks: [H] each head's extra logit in the softmax's max and sum, with no value (gpt-oss)."""
        first = max(0, pos - window + 1) if window else 0  # a sliding window keeps the last `window` keys
        k, v = (np.concatenate([x[b] for b in self.tables[seq]])[first : pos + 1] for x in self.held)
        out = np.zeros((self.h, self.d))
        for h in range(self.h):
            s = k[:, h // self.group] @ q[h].astype(np.float16).astype(np.float64) * scale
            sink = -np.inf if sinks is None else float(sinks[h])
            m = max(s.max(), sink)
            w = np.exp(s - m)
            out[h] = (w / (w.sum() + np.exp(sink - m))) @ v[:, h // self.group]
        return out


def attend(
    c: Cache, q: np.ndarray, seqs: list[int], pos: list[int], cols: int, split_keys: int, window: int = 0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Attention of q [T, H, d] (token t of sequence seqs[t] at position pos[t]) into a guarded output;
    sinks: [H] or None."""
    T, H, d = len(seqs), c.h, c.d
    whole, out = guarded(np.full((T, H * d), np.nan, np.float32))
    BE.split_keys = split_keys
    try:
        BE.attention(
            BE.from_host(q), c.kv, 0, BE.from_host(c.table(list(range(len(c.tables))), cols)),
            BE.from_host(np.array(seqs, np.int32)), BE.from_host(np.array(pos, np.int32)), window, d**-0.5,
            out.reshape(T, H, d), 0.0, None if sinks is None else BE.from_host(sinks),
        )  # fmt: skip
        got = BE.to_host(out).reshape(T, H, d)
    finally:
        BE.split_keys = ATTN_SPLIT_KEYS
    assert guards_intact(whole, (T, H * d)), "attention wrote outside its output"
    return got


@pytest.mark.parametrize(
    "dtype", ["f16", pytest.param("q8_0", marks=pytest.mark.skipif(not FULL, reason="slow"))]
)
def test_split_attention_matches_unsplit_and_is_batch_invariant(dtype: str) -> None:
    rng = np.random.default_rng(11)
    lengths = [LONG, SHORT, MID]
    c = Cache(dtype, lengths, rng)
    cols = max(len(t) for t in c.tables)
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    pos = [n - 1 for n in lengths]
    split = attend(c, q, [0, 1, 2], pos, cols, ATTN_SPLIT_KEYS)
    unsplit = attend(c, q, [0, 1, 2], pos, cols, 0)
    for t in range(3):  # within the unsplit kernel's tolerance (f16 softmax weights, as llama.cpp)
        ref = c.reference(q[t], t, pos[t], D**-0.5)
        assert nmse(split[t], ref) < 1e-6 and nmse(unsplit[t], ref) < 1e-6
    np.testing.assert_array_equal(split[1], unsplit[1])  # the short context is not split: the same bits
    assert not np.array_equal(split[0], unsplit[0])  # ... the long ones are
    # the same bits in another batch with a wider table (a taller grid), launched again (the merge
    # counters were reset by the last launch)
    again = attend(c, q[[2, 0]], [2, 0], [pos[2], pos[0]], cols + 3, ATTN_SPLIT_KEYS)
    np.testing.assert_array_equal(again, split[[2, 0]])


def test_split_attention_over_a_sliding_window() -> None:
    """A window longer than split_keys (Gemma 3's sliding layers): the splits cover its keys only."""
    rng = np.random.default_rng(8)
    c = Cache("f16", [LONG], rng)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    window = 2 * ATTN_SPLIT_KEYS + 5
    got = attend(c, q, [0], [LONG - 1], len(c.tables[0]), ATTN_SPLIT_KEYS, window)
    assert nmse(got[0], c.reference(q[0], 0, LONG - 1, D**-0.5, window)) < 1e-6
    assert nmse(got[0], c.reference(q[0], 0, LONG - 1, D**-0.5)) > 1e-4  # the window mattered


def test_attention_sinks_split_and_unsplit() -> None:
    """gpt-oss's sinks: each head's extra logit in the softmax's denominator (and its max), no value. A
    split token counts its sink once in the merged denominator; sinks large enough to take most of the
    weight, and one below every score, both match the float64 reference; a sinks array that is not [H]
    is refused before the kernel reads it."""
    rng = np.random.default_rng(13)
    lengths = [LONG, SHORT]
    c = Cache("f16", lengths, rng)
    cols = max(len(t) for t in c.tables)
    q = rng.standard_normal((2, H, D)).astype(np.float32)
    pos = [n - 1 for n in lengths]
    sinks = np.array([8.0, -30.0], np.float32)  # head 0: the sink takes most weight; head 1: nearly none
    split = attend(c, q, [0, 1], pos, cols, ATTN_SPLIT_KEYS, sinks=sinks)
    unsplit = attend(c, q, [0, 1], pos, cols, 0, sinks=sinks)
    for t in range(2):
        ref = c.reference(q[t], t, pos[t], D**-0.5, sinks=sinks)
        assert nmse(split[t], ref) < 1e-6 and nmse(unsplit[t], ref) < 1e-6
        assert nmse(split[t, 0], c.reference(q[t], t, pos[t], D**-0.5)[0]) > 0.5  # head 0's sink mattered
    np.testing.assert_array_equal(split[1], unsplit[1])  # the short context is not split
    with pytest.raises(ValueError, match=r"attention sinks of shape \(3,\) for 2 heads"):
        attend(c, q, [0, 1], pos, cols, 0, sinks=np.zeros(3, np.float32))


def test_split_attention_feeds_the_fused_quantization() -> None:
    """The merging block quantizes the head's output for the output projection: attention + matmul fused
    give the bits of the two run apart."""
    from gguf import GGMLQuantizationType as T

    from edgellm.backends.cuda.matmul import upload_weight
    from edgellm.quants.packing import pack_weight
    from edgellm.testing.kernel_refs import random_raw

    rng = np.random.default_rng(5)
    c = Cache("f16", [MID, SHORT], rng)
    w = upload_weight(pack_weight(T.Q8_0, random_raw(T.Q8_0, 4, H * D, rng), 4, H * D))
    q = rng.standard_normal((2, H, D)).astype(np.float32)
    tables = BE.from_host(c.table([0, 1], len(c.tables[0])))
    seqs, pos = (
        BE.from_host(np.array([0, 1], np.int32)),
        BE.from_host(np.array([MID - 1, SHORT - 1], np.int32)),
    )
    results = []
    for fuse in (False, True):
        BE.fuse = fuse
        BE.stats.reset()
        out, res = BE.empty((2, H, D)), BE.empty((2, 4))
        BE.attention(BE.from_host(q), c.kv, 0, tables, seqs, pos, 0, D**-0.5, out)
        BE.matmul(out.reshape(2, H * D), w, res)
        results.append((BE.to_host(out), BE.to_host(res), dict(BE.stats.launches)))
    BE.fuse = True
    (plain_o, plain_r, plain_n), (fused_o, fused_r, fused_n) = results
    assert "quantize_act_cuda" in plain_n and "quantize_act_cuda" not in fused_n
    np.testing.assert_array_equal(fused_o, plain_o)
    np.testing.assert_array_equal(fused_r, plain_r)


@pytest.mark.skipif(not FULL, reason="slow in the simulator")
def test_split_attention_at_smollm2_heads() -> None:
    """SmolLM2's head dim 64 and 3 query heads per KV head, one decode token over LONG keys."""
    rng = np.random.default_rng(2)
    c = Cache("f16", [LONG], rng, n_kv=1, group=3, d=64)
    q = rng.standard_normal((1, 3, 64)).astype(np.float32)
    split = attend(c, q, [0], [LONG - 1], len(c.tables[0]), ATTN_SPLIT_KEYS)
    unsplit = attend(c, q, [0], [LONG - 1], len(c.tables[0]), 0)
    ref = c.reference(q[0], 0, LONG - 1, 64**-0.5)
    assert nmse(split[0], ref) < 1e-6 and nmse(unsplit[0], ref) < 1e-6
