"""Phi-3 (LongRoPE, fused Q|K|V and gate|up), SmolLM3 (NoPE layers) and fused attn_qkv: what llama.cpp 0.3.36
refuses is refused at load, naming it; the choice it makes by the context window is made here by the
engine's (their logits: tests/gguf/test_oracle_cases.py, cases phi3_*, smollm3_*, *_qkv_fused*)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.oracle.cases import CASES, nmse
from edgellm.testing.paths import ORACLE_FIXTURES
from edgellm.testing.synthetic.models import Typed, write_tiny_model

U32 = GGUFValueType.UINT32

FIXTURES = ORACLE_FIXTURES
LAYERS = range(2)
QKV_ROWS = (("q", 64), ("k", 32), ("v", 32))
SEPARATE_QKV = {f"blk.{il}.attn_{x}.weight": (rows, 64) for il in LAYERS for x, rows in QKV_ROWS}


def load(path: Path):  # noqa: ANN201
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    return cfg


# Each of these files fails to load in llama.cpp 0.3.36 ("wrong number of tensors": a tensor its loader does
# not create for the architecture, or a second form of Q|K|V)
@pytest.mark.parametrize(
    "arch, extra, match",
    [
        ("phi3", {f"blk.{il}.ffn_gate.weight": (128, 64) for il in LAYERS}, r"'blk.0.ffn_gate.weight'"),
        ("phi3", {f"blk.{il}.attn_output.bias": (64,) for il in LAYERS}, r"'blk.0.attn_output.bias'"),
        ("phi3", {f"blk.{il}.ffn_up.bias": (256,) for il in LAYERS}, r"'blk.0.ffn_up.bias'"),
        ("phi3", {"rope_freqs.weight": np.ones(8, np.float32)}, r"'rope_freqs.weight'"),
        ("phi3", {"output.bias": (298,)}, r"'output.bias'"),
        ("smollm3", {f"blk.{il}.attn_output.bias": (64,) for il in LAYERS}, r"'blk.0.attn_output.bias'"),
        ("smollm3", {f"blk.{il}.ffn_up.bias": (128,) for il in LAYERS}, r"'blk.0.ffn_up.bias'"),
        ("smollm3", {"rope_freqs.weight": np.ones(8, np.float32)}, r"'rope_freqs.weight'"),
        ("llama", {"rope_factors_long.weight": np.ones(8, np.float32)}, r"'rope_factors_long.weight'"),
        ("qwen2", {"output.bias": (298,)}, r"'output.bias'"),
    ],
)
def test_tensors_llamacpp_does_not_read_are_refused(
    tmp_path: Path, arch: str, extra: dict, match: str
) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, extra_tensors=extra)
    with pytest.raises(GGUFError, match=rf"tensor {match} .*is not one edgellm implements for {arch}"):
        load(path)


FUSED = {f"blk.{il}.attn_qkv.weight": (128, 64) for il in LAYERS}
FUSED_BIAS = {f"blk.{il}.attn_qkv.bias": (128,) for il in LAYERS}
Q_BIAS = {f"blk.{il}.attn_q.bias": (64,) for il in LAYERS}
NO_SEPARATE = [f"blk.{il}.attn_{x}.weight" for il in LAYERS for x in "qkv"]


@pytest.mark.parametrize(
    "extra, skip",
    [
        (FUSED, []),  # attn_qkv.weight beside attn_q/k/v.weight
        (FUSED_BIAS, []),  # a fused bias of separate weights
        ({**FUSED, **FUSED_BIAS, **Q_BIAS}, NO_SEPARATE),  # both forms of the biases
    ],
    ids=["both_weights", "fused_bias_separate_weights", "both_biases"],
)
def test_both_forms_of_qkv_are_refused(tmp_path: Path, extra: dict, skip: list) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", extra_tensors=extra, skip_tensors=skip)
    with pytest.raises(GGUFError, match=r"layer 0 has Q\|K\|V tensors in both forms"):
        load(path)


def test_phi3_with_separate_qkv_loads_and_qwen2_needs_its_biases_in_some_form(tmp_path: Path) -> None:
    """llama.cpp reads either form, per layer; Qwen 2's required Q|K|V biases may be fused or separate."""
    skip = [f"blk.{il}.attn_qkv.weight" for il in LAYERS]
    cfg = load(write_tiny_model(tmp_path / "p.gguf", "phi3", extra_tensors=SEPARATE_QKV, skip_tensors=skip))
    assert cfg.qkv_fused == [False, False] and cfg.gate_up_fused
    layer1_fused = {"blk.1.attn_qkv.weight": (128, 64)}
    layer1 = write_tiny_model(
        tmp_path / "m.gguf", "llama", extra_tensors=layer1_fused, skip_tensors=NO_SEPARATE[3:]
    )
    mixed = load(layer1)
    assert mixed.qkv_fused == [False, True]
    biases = [f"blk.{il}.attn_{x}.bias" for il in LAYERS for x in "qkv"]
    fused_bias = write_tiny_model(tmp_path / "q.gguf", "qwen2", extra_tensors={**FUSED, **FUSED_BIAS},
                                  skip_tensors=NO_SEPARATE + biases)  # fmt: skip
    assert load(fused_bias).qkv_fused == [True, True]
    unbiased = write_tiny_model(
        tmp_path / "u.gguf", "qwen2", extra_tensors=FUSED, skip_tensors=NO_SEPARATE + biases
    )
    with pytest.raises(GGUFError, match=r"missing tensor 'blk.0.attn_q.bias' \(qwen2 has Q\|K\|V biases\)"):
        load(unbiased)


def test_phi3_heads_narrower_than_the_model_are_refused(tmp_path: Path) -> None:
    """llama.cpp's Phi-3 projects Q and the attention output at n_embd: H * head_dim must be n_embd."""
    md = {"phi3.attention.key_length": Typed(8, U32), "phi3.attention.value_length": Typed(8, U32),
          "phi3.rope.dimension_count": 8}  # fmt: skip
    path = write_tiny_model(tmp_path / "m.gguf", "phi3", metadata_overrides=md)
    with pytest.raises(GGUFError, match=r"4 heads of 8 are not the model width 64"):
        load(path)


@pytest.mark.parametrize("shape, match", [((4,), r"shape \(4,\)"), ((8,), r"holds \[0.0\]")])
def test_phi3_bad_rope_factors_are_refused(tmp_path: Path, shape: tuple, match: str) -> None:
    factors = np.ones(shape, np.float32)
    factors[0] = 0.0 if shape == (8,) else 1.0
    path = write_tiny_model(tmp_path / "m.gguf", "phi3", extra_tensors={"rope_factors_short.weight": factors})
    with pytest.raises(GGUFError, match=rf"tensor 'rope_factors_short.weight' .*{match}"):
        load(path)


def test_smollm3_attention_scale_key_is_refused(tmp_path: Path) -> None:
    """llama.cpp's SmolLM3 never reads attention.scale: a file carrying one means another model."""
    md = {"smollm3.attention.scale": 0.5}
    path = write_tiny_model(tmp_path / "m.gguf", "smollm3", metadata_overrides=md)
    with pytest.raises(GGUFError, match=r"metadata key 'smollm3.attention.scale'"):
        load(path)


def test_smollm3_skips_rope_in_every_fourth_layer(tmp_path: Path) -> None:
    cfg = load(write_tiny_model(tmp_path / "m.gguf", "smollm3", n_layers=8))
    assert [cfg.rope_of_layer(il) is None for il in range(8)] == [False, False, False, True] * 2
    assert cfg.rope_type == 0  # adjacent pairs, as the llama converter permutes Q/K


def test_phi3_long_factors_from_a_context_beyond_the_original_padded_as_llamacpp(tmp_path: Path) -> None:
    """llama.cpp rounds n_ctx up to a multiple of 256 and takes the long factors when that exceeds the
    original context (the phi3_ctx_pad case checks the logits of 1200 against an original 1250)."""
    path = CASES["phi3_f32"].write(tmp_path / "m.gguf")  # original context 1024
    cfg = load(path)
    short, long = cfg.longrope.short.freq_factors, cfg.longrope.long.freq_factors
    assert cfg.rope.freq_factors == short and len(short) == 8 and short != long
    assert cfg.rope.attn_factor == pytest.approx(1.19)
    for n_ctx, want in ((1024, short), (1025, long), (800, short), (4096, long)):
        cfg.set_context(n_ctx)
        assert cfg.rope.freq_factors == want and cfg.rope_swa is cfg.rope, n_ctx
    cfg.longrope = type(cfg.longrope)(cfg.longrope.short, cfg.longrope.long, 1250)
    cfg.set_context(1200)
    assert cfg.rope.freq_factors == long


def test_engine_core_takes_the_factors_of_its_context(tmp_path: Path) -> None:
    """EngineCoreProc with llama.cpp's n_ctx (1200, past the original 1024) scores the phi3_f32
    fixture's tokens as llama.cpp does; with a context of 1024 it rotates with the short factors and
    does not."""
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc

    ref = np.load(FIXTURES / "phi3_f32.npz")
    path = CASES["phi3_f32"].write(tmp_path / "m.gguf")
    tokens, positions = ref["tokens"].tolist(), ref["positions"]
    for n_ctx in (1200, 1024):
        core = EngineCoreProc(EngineConfig(str(path), n_ctx=n_ctx, kv_cache_memory=8 << 20, threads=2))
        keep = positions < n_ctx
        got = core.score(tokens[:n_ctx])[positions[keep]]
        err = nmse(got, ref["logits"][keep])
        assert (err < 1e-6) if n_ctx == 1200 else (err > 1e-3), (n_ctx, err)


def test_fused_cpu_layer_leaves_smollm3s_nope_layer_to_the_blocks(tmp_path: Path) -> None:
    """The one-call CPU layer always rotates: it declines the layer without rope, and the model's logits
    are those of the blocks."""
    from edgellm.backends.cpu import tiers
    from edgellm.testing.fused import QTYPES
    from edgellm.testing.fused import load_runner as _load
    from edgellm.testing.fused import run_logits as _logits

    if not tiers.active_tier().fused_layer:
        pytest.skip("the fused layer needs a tile tier with F16C")
    path = write_tiny_model(tmp_path / "m.gguf", "smollm3", QTYPES, n_layers=4)
    fused_model, fused = _load(path, True)
    assert [f is None for f in fused_model.fused] == [False, False, False, True]
    _, plain = _load(path, False)
    got, want = _logits(fused, np.random.default_rng(1)), _logits(plain, np.random.default_rng(1))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
