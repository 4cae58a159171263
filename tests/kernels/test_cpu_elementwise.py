"""CPU elementwise kernels: SwiGLU (ggml's AVX-512 vectorised form on every tile tier, libm on the portable
one), rotary embedding from the backend's cached cos/sin tables and RMSNorm, against references (float64,
or ggml's float32 formulas where the kernels follow its roundings) and each other."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.cpu import ops, silu_ir, tiers
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.gguf.rope import RopeParams
from edgellm.testing.rope_ref import ggml_rope_ref

TILE_TIERS = [t.name for t in tiers.compiled_tiers()]


def swiglu_ref(gate_up: np.ndarray) -> np.ndarray:
    ff = gate_up.shape[1] // 2
    g = gate_up[:, :ff].astype(np.float64)
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * gate_up[:, ff:].astype(np.float64)


@pytest.mark.parametrize("tier", TILE_TIERS)
@pytest.mark.parametrize("ff", [1536, 1544, 7])  # 7 / 1544: the n % 16 leftovers take libm's expf
def test_swiglu_vec_matches_reference(ff: int, tier: str) -> None:
    rng = np.random.default_rng(ff)
    gate_up = (rng.standard_normal((9, 2 * ff)) * 4).astype(np.float32)
    special = [0.0, -0.0, 1e-30, 30.0, -30.0, 88.0, -88.0, 100.0, -100.0, 150.0, -150.0, 5.0, -5.0]
    gate_up[0, : min(ff, len(special))] = special[:ff]
    out = np.full((9, ff), np.nan, np.float32)
    index = tiers.by_name(tier).index
    silu_ir.swiglu_vec_cpu(gate_up, out, index)
    ref = swiglu_ref(gate_up)
    big = np.abs(ref) > 1e-30
    rel = np.abs(out[big] - ref[big]) / np.abs(ref[big])
    assert rel.max() < 1e-6, rel.max()  # ggml's exp: <= 1.5 ulp, plus the division's rounding
    assert np.all(out[~big] == 0) or np.allclose(out[~big], ref[~big], atol=1e-30)
    par = np.empty_like(out)
    silu_ir.swiglu_vec_par_cpu(gate_up, par, index)
    np.testing.assert_array_equal(par, out)  # same row code serial and parallel
    portable = np.empty_like(out)
    ops.swiglu_cpu(gate_up, portable)
    np.testing.assert_allclose(out, portable, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("tier", TILE_TIERS[1:])
def test_swiglu_vec_lower_tiers_give_the_best_tiers_bits(tier: str) -> None:
    """Every x in steps of 1/64 over [-110, 110] (exp(-x) overflowing, subnormal, in between) and random
    values: a tier's exp scaling (vscalefps, or its two-multiply form) gives the same bits."""
    dense = np.arange(-110 * 64, 110 * 64 + 16, dtype=np.float32)[: 220 * 64] / np.float32(64)
    gate = np.concatenate([dense, np.random.default_rng(7).standard_normal(4096).astype(np.float32) * 30])
    gate_up = np.concatenate([gate, np.ones_like(gate)])[None, :]
    outs = []
    for name in (TILE_TIERS[0], tier):
        out = np.empty((1, gate.size), np.float32)
        silu_ir.swiglu_vec_cpu(gate_up, out, tiers.by_name(name).index)
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("tier", ["portable", *TILE_TIERS])
def test_backend_swiglu_path_follows_its_tier(tier: str) -> None:
    """The backend uses ggml's vectorised form exactly on a tile tier."""
    rng = np.random.default_rng(1)
    gate_up = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.empty((3, 32), np.float32)
    CpuBackend(tier).gated_act(gate_up, out, "silu")
    expect = np.empty_like(out)
    if tier == "portable":
        ops.swiglu_par_cpu(gate_up, expect)
    else:
        silu_ir.swiglu_vec_cpu(gate_up, expect, tiers.by_name(tier).index)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("kind", ["silu", "gelu"])
def test_gated_act_is_batch_invariant(kind: str) -> None:
    """A row's activation has the same bits in a batch of 9 (the parallel kernel) as alone (a decode):
    Gemma's GeGLU did not, which made a verified draft's logits differ from its decode's."""
    rng = np.random.default_rng(2)
    gate_up = (rng.standard_normal((9, 4096)) * 3).astype(np.float32)
    be = CpuBackend()
    batched = np.empty((9, 2048), np.float32)
    be.gated_act(gate_up, batched, kind)
    for t in range(9):
        one = np.empty((1, 2048), np.float32)
        be.gated_act(np.ascontiguousarray(gate_up[t : t + 1]), one, kind)
        np.testing.assert_array_equal(one[0], batched[t], err_msg=f"row {t}")


@pytest.mark.parametrize("neox", [False, True])
def test_rope_from_cached_tables(neox: bool) -> None:
    """Rotary embedding through the backend's table (grown past its first 1024 positions) equals ggml's
    float32 rope (tests/kernels/test_rope.py's transcription) bit for bit, and so does the one-call path."""
    rng = np.random.default_rng(2)
    T, H, d, n_rot, base = 6, 3, 64, 48, 10000.0  # n_rot < d: the last 16 dims are left alone
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    pos = np.array([0, 1, 7, 1023, 1024, 3000], np.int32)
    be = CpuBackend()
    got = x.copy()
    rope = RopeParams(n_rot=n_rot, neox=neox, base=base)
    be.rope(got, pos, rope)
    assert be._rope_tables[rope][0].shape[0] >= 3001
    one_call = x.copy()
    ops.rope_cpu(one_call, pos, rope)
    np.testing.assert_array_equal(got, one_call)
    np.testing.assert_array_equal(got, ggml_rope_ref(x, pos, rope))  # llama.cpp's float32 rope, bit for bit
    np.testing.assert_array_equal(got[:, :, n_rot:], x[:, :, n_rot:])


def rmsnorm_ggml_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ggml's rms_norm then mul, written out: float32 squares summed in float64, mean = (float)(sum / n),
    scale = 1.0f / sqrtf(mean + eps) in float32, out = (x * scale) * w."""
    x = np.asarray(x, np.float32)
    total = (x * x).astype(np.float64).sum(axis=-1)
    mean = (total / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale[..., None]) * w


def test_rmsnorm_is_ggmls_float32_formula() -> None:
    """RMSNorm (rows and per-head) equals ggml's float32 roundings bit for bit; the same formula with the
    scale computed in float64, as the kernel once did, differs in a share of the rows (so the bits here are
    not an accident of the data)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 576)) * rng.uniform(0.01, 30, (64, 1))).astype(np.float32)
    w = rng.uniform(0.2, 2.0, 576).astype(np.float32)
    out = np.empty_like(x)
    ops.rmsnorm_cpu(x, w, 1e-5, out)
    want = rmsnorm_ggml_ref(x, w, 1e-5)
    np.testing.assert_array_equal(out, want)
    f64_scale = (1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1) + 1e-5)).astype(np.float32)
    assert ((x * f64_scale[:, None]) * w != want).any(axis=-1).sum() >= 4
    heads = x.reshape(64, 9, 64).copy()
    ops.rmsnorm_heads_cpu(heads, w[:64], 1e-6)
    np.testing.assert_array_equal(heads, rmsnorm_ggml_ref(x.reshape(64, 9, 64), w[:64], 1e-6))
    aliased = x.copy()
    ops.rmsnorm_cpu(aliased, w, 1e-5, aliased)  # out may alias x (the fused layer's post-norms)
    np.testing.assert_array_equal(aliased, want)
