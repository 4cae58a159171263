"""Rope scaling: the backends' rotation against a direct transcription of llama.cpp's formulas, and the
parameters read from GGUF metadata as llama.cpp (0.3.36) reads them, with refusals for what is not
implemented. The whole-model check against llama.cpp's logits is tests/gguf/test_oracle_cases.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgellm.backends.cpu import ops
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.rope import RopeParams
from edgellm.testing.rope_ref import ggml_rope_ref
from edgellm.testing.synthetic.models import write_tiny_model

STRONG_FACTORS = tuple(float(f) for f in np.geomspace(1.0, 40.0, 24))
ROPES = {
    "plain": RopeParams(n_rot=48, neox=True, base=10000.0),
    "llama3-factors": RopeParams(n_rot=48, neox=False, base=500000.0, freq_factors=STRONG_FACTORS),
    "linear-x4": RopeParams(n_rot=48, neox=False, base=10000.0, freq_scale=0.25),
    "yarn-x4": RopeParams(
        n_rot=48, neox=True, base=1e6, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=4096
    ),
    "yarn-x8-attn": RopeParams(
        n_rot=48, neox=False, base=10000.0, freq_scale=0.125, ext_factor=1.0, attn_factor=1.3, n_ctx_orig=512
    ),
    "linear-x8-attn": RopeParams(n_rot=48, neox=True, base=1e6, freq_scale=0.125, attn_factor=0.7),
}


@pytest.mark.parametrize("name", ROPES)
def test_rope_tables_match_llamacpp_formulas(name: str) -> None:
    """The backend's cos/sin tables rotate as llama.cpp's CPU rope does, bit for bit, at positions past the
    1,024 of the first table."""
    rope = ROPES[name]
    rng = np.random.default_rng(7)
    T, H, d = 7, 2, 64  # n_rot 48 < d: the last 16 dims pass through
    x = rng.standard_normal((T, H, d)).astype(np.float32)
    pos = np.array([0, 1, 13, 1000, 1024, 2500, 4095], np.int32)
    got = x.copy()
    be = CpuBackend()
    be.rope(got, pos, rope)
    one_call = x.copy()
    ops.rope_cpu(one_call, pos, rope)
    np.testing.assert_array_equal(got, one_call)
    ref = ggml_rope_ref(x, pos, rope)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:, :, 48:], x[:, :, 48:])


def test_rope_tables_are_kept_per_parameter_set() -> None:
    """Two layer kinds with the same base but different scaling get different tables (a table keyed by
    the base alone would rotate the second like the first)."""
    be = CpuBackend()
    x = np.ones((1, 1, 8), np.float32)
    plain, scaled = RopeParams(n_rot=8, neox=True), RopeParams(n_rot=8, neox=True, freq_scale=0.5)
    a, b = x.copy(), x.copy()
    pos = np.array([3000], np.int32)
    be.rope(a, pos, plain)
    be.rope(b, pos, scaled)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(b, ggml_rope_ref(x, pos, scaled), atol=3e-5)


def _config(tmp_path, arch: str = "llama", n_layers: int = 2, **overrides):  # noqa: ANN001, ANN202
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, n_layers=n_layers, metadata_overrides=overrides)
    return config_from_gguf(load_gguf(str(path)))


def test_yarn_parameters_from_metadata(tmp_path) -> None:  # noqa: ANN001
    """qwen3 YaRN x4 from 32k: llama.cpp's ext_factor 1, betas 32 / 1, the original context as its
    correction dims' context, and its attention factor (get_mscale(4) / (1 + 0.1 ln 4) = 1 times
    rope.scaling.attn_factor), so that cos/sin carry (1 + 0.1 ln 4) * attn_factor."""
    cfg = _config(
        tmp_path,
        "qwen3",
        **{
            "qwen3.rope.scaling.type": "yarn",
            "qwen3.rope.scaling.factor": 4.0,
            "qwen3.rope.scaling.original_context_length": 32768,
            "qwen3.rope.scaling.attn_factor": 0.8,
        },
    )
    r = cfg.rope
    assert (r.freq_scale, r.ext_factor, r.beta_fast, r.beta_slow, r.n_ctx_orig) == (
        0.25,
        1.0,
        32.0,
        1.0,
        32768,
    )
    assert r.attn_factor == pytest.approx(0.8, rel=1e-6)
    assert r.mscale == pytest.approx(0.8 * (1 + 0.1 * math.log(4)), rel=1e-6)
    assert cfg.rope_swa is r


@pytest.mark.parametrize(
    ("scaling", "factor", "freq_scale"), [(None, 4.0, 0.25), ("linear", 4.0, 0.25), ("none", 4.0, 1.0)]
)
def test_linear_scaling_from_metadata(tmp_path, scaling, factor, freq_scale) -> None:  # noqa: ANN001
    """A factor without a type is linear (llama.cpp's default type); type none never scales."""
    md = {"llama.rope.scaling.factor": factor}
    if scaling:
        md["llama.rope.scaling.type"] = scaling
    r = _config(tmp_path, **md).rope
    assert (r.freq_scale, r.ext_factor, r.mscale) == (freq_scale, 0.0, 1.0)


def test_gemma3_local_layers_have_their_own_base_and_no_scaling(tmp_path) -> None:  # noqa: ANN001
    """gemma3.rope.freq_base_swa is the sliding-window layers' base (10000 when absent); rope scaling
    (linear x8 in the 4B-27B files) applies to the global layers only, as in llama.cpp."""
    cfg = _config(
        tmp_path,
        "gemma3",
        n_layers=7,
        **{"gemma3.rope.freq_base_swa": 20000.0, "gemma3.rope.scaling.type": "linear",
           "gemma3.rope.scaling.factor": 8.0},
    )  # fmt: skip
    assert cfg.swa_layers[:6] == [True] * 5 + [False]
    assert (cfg.rope_of_layer(0).base, cfg.rope_of_layer(0).freq_scale) == (20000.0, 1.0)
    assert (cfg.rope_of_layer(5).base, cfg.rope_of_layer(5).freq_scale) == (1e6, 0.125)
    assert _config(tmp_path, "gemma3").rope_swa.base == 10000.0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"llama.rope.scaling.type": "longrope"}, r"llama.rope.scaling.type = 'longrope' \(LongRoPE"),
        ({"llama.rope.scaling.type": "dynamic"}, r"llama.rope.scaling.type = 'dynamic' is not supported"),
        ({"llama.rope.scaling.type": 3}, r"llama.rope.scaling.type must be a string"),
        ({"llama.rope.scaling.factor": -2.0}, r"llama.rope.scaling.factor = -2.0 is out of range"),
        ({"llama.rope.scaling.attn_factor": 0.0}, r"llama.rope.scaling.attn_factor = 0.0 is out of range"),
        ({"llama.rope.scaling.original_context_length": -5}, r"original_context_length = -5 is out of range"),
        ({"llama.rope.scaling.yarn_beta_fast": 16.0}, r"yarn_beta_fast = 16.0 is not supported"),
        ({"llama.rope.scaling.yarn_log_multiplier": 0.1}, r"yarn_log_multiplier = 0.1"),
        ({"llama.rope.scaling.alpha": 1000.0}, r"llama.rope.scaling.alpha = 1000.0 \(NTK"),
    ],
    ids=["longrope", "dynamic", "type-int", "factor-negative", "attn-zero", "orig-ctx-negative", "beta",
         "log-mul", "alpha"],
)  # fmt: skip
def test_rope_metadata_refusals_name_the_key(tmp_path, overrides, match) -> None:  # noqa: ANN001
    with pytest.raises(GGUFError, match=match):
        _config(tmp_path, **overrides)


def test_yarn_keys_equal_to_llamacpps_values_load(tmp_path) -> None:  # noqa: ANN001
    r = _config(
        tmp_path,
        **{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 2.0,
           "llama.rope.scaling.yarn_beta_fast": 32.0, "llama.rope.scaling.yarn_ext_factor": 1.0},
    ).rope  # fmt: skip
    assert (r.freq_scale, r.ext_factor) == (0.5, 1.0)
    # no original context (or 0, as llama.cpp reads it): the training context
    assert r.n_ctx_orig == 256
    zero = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.original_context_length": 0}
    assert _config(tmp_path, **zero).rope.n_ctx_orig == 256
