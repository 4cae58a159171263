"""gpt-oss (arch/gpt_oss.py) beyond its llama.cpp logits (tests/gguf/test_oracle_cases.py, gpt_oss_*): the
hyper-parameters as llama.cpp reads them, that each of its features is needed for the match (taking one
out moves the logits far past the tolerance), its clamped SwiGLU kernel, the refusal on a backend without
attention sinks, and its GPT-4o pre-tokenizer."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellm.arch.gpt_oss import GptOssModel
from edgellm.backends.cpu import backend as cpu_backend
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.backends.cpu.ops import swiglu_oai_par_cpu
from edgellm.gguf.config import UnsupportedArchitectureError, config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.testing.oracle.cases import CASES, GPT_OSS_WRITER, GPT_OSS_YARN, nmse, score_edgellm
from edgellm.testing.synthetic.models import write_tiny_model
from edgellm.tokenizer.bpe import BpeModel

FIXTURES = Path(__file__).parent.parent / "fixtures" / "oracle"


def test_config_as_llamacpp_reads_it(tmp_path: Path) -> None:
    """Even layers local (pattern 2) at the file's window, their rope as the global layers' (base and YaRN),
    Q.K over sqrt(n_rot), the clamped SwiGLU, SOFTMAX_WEIGHT gating without renormalisation."""
    path = write_tiny_model(
        tmp_path / "m.gguf", "gpt-oss", "F32", n_layers=5, metadata_overrides=GPT_OSS_YARN, **GPT_OSS_WRITER
    )
    cfg = config_from_gguf(load_gguf(str(path)))
    assert cfg.swa_layers == [True, False, True, False, True] and cfg.sliding_window == 128
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (8, 2, 64)
    assert (cfg.activation, cfg.moe_gating, cfg.moe_norm_weights, cfg.attn_sinks) == (
        "swiglu_oai", "softmax_weight", False, True
    )  # fmt: skip
    assert cfg.attn_scale == pytest.approx(1 / math.sqrt(cfg.rope_dim))
    assert cfg.rope.ext_factor == 1.0 and cfg.rope.freq_scale == pytest.approx(1 / 32)
    for field in ("base", "freq_scale", "ext_factor", "attn_factor", "n_ctx_orig"):
        assert getattr(cfg.rope_swa, field) == getattr(cfg.rope, field), field


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("gpt-oss.attention.sliding_window", None, r"missing metadata key .gpt-oss.attention.sliding_window"),
        ("gpt-oss.attention.sliding_window", 0, r"sliding_window = 0"),
        ("gpt-oss.expert_feed_forward_length", None, r"gpt-oss.expert_feed_forward_length"),
    ],
)
def test_required_keys_are_refused_when_missing(tmp_path: Path, key: str, value: Any, match: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "gpt-oss", "F32", metadata_overrides={key: value})
    with pytest.raises(GGUFError, match=match):
        config_from_gguf(load_gguf(str(path)))


def _no_sinks(model: Any) -> None:
    for attn, _ in model.layers:
        attn.sinks = None


def _no_window(model: Any) -> None:
    model.cfg.swa_layers = [False] * model.cfg.n_layers


def _no_yarn(model: Any) -> None:
    cfg = model.cfg
    cfg.rope = cfg.rope_swa = dataclasses.replace(cfg.rope, ext_factor=0.0, freq_scale=1.0, attn_factor=1.0)


def _softmax_over_all_experts(model: Any) -> None:
    model.cfg.moe_gating = "softmax"  # OLMoE's rule: the probabilities over every expert, not renormalised


def _no_expert_biases(model: Any) -> None:
    for _, ffn in model.layers:
        ffn.router_b = ffn.experts.bias_gate_up = ffn.experts.bias_down = None


def _unclamped_swiglu(gate_up: np.ndarray, out: np.ndarray) -> None:
    n = out.shape[1]
    g, u = gate_up[:, :n], gate_up[:, n:]
    out[:] = g / (1 + np.exp(-1.702 * g)) * (u + 1)


KNOCKOUTS: dict[str, Callable[[Any], None] | None] = {
    "sinks": _no_sinks,
    "window": _no_window,
    "yarn": _no_yarn,
    "gating": _softmax_over_all_experts,
    "biases": _no_expert_biases,
    "clamp": None,  # the activation kernel is swapped instead
}


@pytest.mark.parametrize("feature", list(KNOCKOUTS))
def test_each_feature_is_needed_for_the_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, feature: str
) -> None:
    """gpt_oss_f32 with one feature taken out misses llama.cpp's logits by far more than the tolerance
    (measured: docs/oracle_cases.md, NMSE 0.1 to 0.6 against 3e-9 with every feature)."""
    case, ref = CASES["gpt_oss_f32"], np.load(FIXTURES / "gpt_oss_f32.npz")
    path = case.write(tmp_path / "m.gguf")
    if feature == "clamp":
        monkeypatch.setitem(cpu_backend.GATED_ACTS, "swiglu_oai", _unclamped_swiglu)
    got = score_edgellm(path, ref["tokens"], ref["positions"], case.n_ctx, edit=KNOCKOUTS[feature])
    assert nmse(got, ref["logits"]) > 100 * case.nmse_limit


def test_swiglu_oai_matches_ggml() -> None:
    """ggml_compute_forward_swiglu_oai_f32: x = min(gate, 7), y = clamp(up, -7, 7), x * sigmoid(1.702 x) *
    (y + 1), on values on both sides of the limits."""
    rng = np.random.default_rng(0)
    gate_up = (rng.standard_normal((9, 2 * 40)) * 6).astype(np.float32)
    gate_up[0, :4] = [7.0, 7.5, -30.0, 100.0]
    gate_up[0, 40:44] = [-7.0, -9.0, 8.0, 7.0]
    out = np.empty((9, 40), np.float32)
    swiglu_oai_par_cpu(gate_up, out)
    x = np.minimum(gate_up[:, :40].astype(np.float64), 7.0)
    y = np.clip(gate_up[:, 40:].astype(np.float64), -7.0, 7.0)
    np.testing.assert_allclose(out, x / (1 + np.exp(-1.702 * x)) * (y + 1), rtol=1e-5, atol=1e-6)
    assert (np.abs(gate_up) > 7).mean() > 0.1  # the limits are exercised


def test_a_backend_without_attention_sinks_refuses_gpt_oss(tmp_path: Path) -> None:
    """A backend whose attention has no sinks refuses gpt-oss at load, naming the architecture and the
    backend; the CPU and CUDA backends have them."""

    class NoSinks(CpuBackend):
        name, attention_sinks = "nosinks", False

    path = write_tiny_model(tmp_path / "m.gguf", "gpt-oss", "F32")
    g = load_gguf(str(path))
    refused = r"'gpt-oss' is not implemented on the nosinks backend \(it has no attention sinks"
    with pytest.raises(UnsupportedArchitectureError, match=refused):
        GptOssModel(config_from_gguf(g), g, NoSinks())
    from edgellm.backends.cuda.backend import CudaBackend

    assert CudaBackend.attention_sinks is True and CpuBackend.attention_sinks is True


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("HelloWorld", ["Hello", "World"]),  # a case change splits (llama3's regex keeps one word)
        ("don't", ["don't"]),  # the contraction stays on its word
        (" WORLDwide's", [" WORLDwide's"]),  # capitals, then lower case, then the contraction
        ("12345", ["123", "45"]),
        ("a //b\n\n c", ["a", " //", "b", "\n\n", " c"]),
        ("ÉcoleÀb", ["ÉcoleÀb"]),  # llama.cpp's spelling: a non-ASCII capital fits the lower-case run
    ],
)
def test_gpt4o_pre_tokenizer_splits_as_llamacpp(text: str, pieces: list[str]) -> None:
    model = BpeModel(["a"], [], "gpt-4o")
    split = model._hf.pre_tokenizer.pre_tokenize_str(text)
    from edgellm.tokenizer.bpe import byte_level_decode

    assert [byte_level_decode(p).decode() for p, _ in split] == pieces
