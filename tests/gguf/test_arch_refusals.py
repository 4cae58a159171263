"""Gemma 2, Granite, OLMo 2, StarCoder 2 and GPT-2 files edgellm does not run as llama.cpp would, and
LFM2 variants it does not implement, are refused at load, naming why (the logits of the ones it runs:
tests/gguf/test_oracle_cases.py, cases gemma2_*, granite_*, olmo2_*, starcoder2_* and gpt2_*)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from edgellm.gguf.config import UnsupportedArchitectureError, config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.synthetic.models import Typed, write_tiny_model

U32 = GGUFValueType.UINT32


def load(path: Path) -> None:
    g = load_gguf(str(path))
    validate_model(g, config_from_gguf(g))


def test_gemma2_output_weight_is_refused(tmp_path: Path) -> None:
    """llama.cpp's Gemma 2 projects with the embedding: a file's own output.weight would go unused there."""
    path = write_tiny_model(tmp_path / "m.gguf", "gemma2", extra_tensors={"output.weight": (294, 64)})
    with pytest.raises(GGUFError, match=r"tensor 'output.weight' is not one edgellm implements for gemma2"):
        load(path)


def test_gemma2_caps_default_to_llamacpps(tmp_path: Path) -> None:
    """Without the keys, llama.cpp caps at 50 (attention) and 30 (logits) and windows even layers at 4096."""
    drop = {"gemma2.attn_logit_softcapping": None, "gemma2.final_logit_softcapping": None,
            "gemma2.attention.sliding_window": None}  # fmt: skip
    path = write_tiny_model(tmp_path / "m.gguf", "gemma2", n_layers=4, metadata_overrides=drop)
    cfg = config_from_gguf(load_gguf(str(path)))
    assert (cfg.attn_softcap, cfg.final_logit_softcap, cfg.sliding_window) == (50.0, 30.0, 4096)
    assert cfg.swa_layers == [True, False, True, False]


@pytest.mark.parametrize("n_layers, scale", [(46, 1 / 32**0.5), (26, 1 / 16**0.5)])
def test_gemma2_27b_scales_q_by_width_per_head(tmp_path: Path, n_layers: int, scale: float) -> None:
    """llama.cpp: the 46-layer 27B scales Q by 1/sqrt(n_embd // n_heads), the others by 1/sqrt(head)."""
    path = write_tiny_model(tmp_path / "m.gguf", "gemma2", n_layers=n_layers, n_heads=2, n_kv_heads=1)
    cfg = config_from_gguf(load_gguf(str(path)))
    assert (cfg.head_dim, cfg.attn_scale) == (16, pytest.approx(scale))


def test_granite_without_logit_scale_is_refused(tmp_path: Path) -> None:
    """llama.cpp requires granite.logit_scale (the logits are divided by it)."""
    path = write_tiny_model(tmp_path / "m.gguf", "granite", metadata_overrides={"granite.logit_scale": None})
    with pytest.raises(GGUFError, match=r"granite\.logit_scale"):
        load(path)


def test_granite_without_rope_is_refused(tmp_path: Path) -> None:
    """rope.scaling.finetuned = false turns llama.cpp's rope off for Granite (NoPE): not implemented."""
    path = write_tiny_model(
        tmp_path / "m.gguf", "granite", metadata_overrides={"granite.rope.scaling.finetuned": False}
    )
    with pytest.raises(GGUFError, match=r"granite\.rope\.scaling\.finetuned = False .*not implemented"):
        load(path)


@pytest.mark.parametrize(
    "key", ["granite.attn_logit_softcapping", "granite.expert_shared_feed_forward_length"]
)
def test_granite_unknown_key_is_refused(tmp_path: Path, key: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "granite", metadata_overrides={key: 4})
    with pytest.raises(GGUFError, match=rf"metadata key '{key}'"):
        load(path)


def test_olmo2_without_output_weight_is_refused(tmp_path: Path) -> None:
    """llama.cpp's OLMo 2 requires its own output matrix (no tied embedding)."""
    path = write_tiny_model(tmp_path / "m.gguf", "olmo2", tied=True)
    with pytest.raises(GGUFError, match=r"missing tensor 'output.weight'|'output.weight'"):
        load(path)


def test_olmo2_pre_norm_is_refused(tmp_path: Path) -> None:
    """OLMo 2 has no norm before attention: a file carrying one is not what llama.cpp's OLMo 2 runs."""
    path = write_tiny_model(tmp_path / "m.gguf", "olmo2", extra_tensors={"blk.0.attn_norm.weight": (64,)})
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.attn_norm.weight' \(attn_norm.weight\) is not one"):
        load(path)


# ---- StarCoder 2, GPT-2 (LayerNorm architectures) and what is not implemented --------------------------
def test_starcoder2_partial_rope_is_refused(tmp_path: Path) -> None:
    """llama.cpp's StarCoder 2 asserts that rope rotates the whole head."""
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "starcoder2",
        metadata_overrides={"starcoder2.rope.dimension_count": Typed(8, U32)},
    )
    with pytest.raises(GGUFError, match=r"starcoder2\.rope\.dimension_count = 8: partial rotary embedding"):
        load(path)


@pytest.mark.parametrize("arch", ["starcoder2", "gpt2"])
def test_layer_norm_epsilon_is_required(tmp_path: Path, arch: str) -> None:
    """llama.cpp reads {arch}.attention.layer_norm_epsilon as required (no default)."""
    drop = {f"{arch}.attention.layer_norm_epsilon": None}
    path = write_tiny_model(tmp_path / "m.gguf", arch, metadata_overrides=drop)
    with pytest.raises(GGUFError, match=rf"{arch}\.attention\.layer_norm_epsilon"):
        load(path)


@pytest.mark.parametrize(
    "arch, tensor, why",
    [
        (
            "starcoder2",
            "blk.0.ffn_gate.weight",
            r"tensor 'blk.0.ffn_gate.weight' \(ffn_gate.weight\) is not one",
        ),
        ("gpt2", "blk.1.attn_q.weight", r"tensor 'blk.1.attn_q.weight' \(attn_q.weight\) is not one"),
        (
            "starcoder2",
            "position_embd.weight",
            r"tensor 'position_embd.weight' is not one edgellm implements",
        ),
    ],
)
def test_layer_norm_arch_foreign_tensor_is_refused(tmp_path: Path, arch: str, tensor: str, why: str) -> None:
    """A gate on StarCoder 2's MLP, separate Q on GPT-2 (llama.cpp reads only attn_qkv), learned positions
    on StarCoder 2: tensors llama.cpp's graphs for these architectures never read."""
    shape = (128, 64) if "blk" in tensor else (2048, 64)
    path = write_tiny_model(tmp_path / "m.gguf", arch, extra_tensors={tensor: shape})
    with pytest.raises(GGUFError, match=why):
        load(path)


@pytest.mark.parametrize(
    "arch, skip",
    [("starcoder2", "blk.1.attn_k.bias"), ("gpt2", "output_norm.bias"), ("gpt2", "position_embd.weight")],
)
def test_layer_norm_arch_required_tensor_missing_is_refused(tmp_path: Path, arch: str, skip: str) -> None:
    """llama.cpp requires every bias of these architectures (and GPT-2's position embeddings)."""
    path = write_tiny_model(tmp_path / "m.gguf", arch, skip_tensors=[skip])
    with pytest.raises(GGUFError, match=rf"missing tensor '{skip}'"):
        load(path)


def test_gpt2_position_rows_must_cover_the_context(tmp_path: Path) -> None:
    """position_embd.weight holds one row per position of gpt2.context_length: fewer rows would leave
    positions the engine allows (n_ctx is capped at the context length) without an embedding."""
    path = write_tiny_model(
        tmp_path / "m.gguf", "gpt2", context_length=256, shape_overrides={"position_embd.weight": (128, 64)}
    )
    with pytest.raises(
        GGUFError, match=r"'position_embd.weight' has shape \(128, 64\), expected \(256, 64\)"
    ):
        load(path)


def test_layer_norm_arch_heads_must_span_the_model(tmp_path: Path) -> None:
    """llama.cpp's StarCoder 2 / GPT-2 tensors have Q as wide as the model (n_heads * head = n_embd)."""
    path = write_tiny_model(tmp_path / "m.gguf", "starcoder2", head_dim=8)
    with pytest.raises(GGUFError, match=r"starcoder2 heads of 8 \(K\) / 8 \(V\) x 4 must span"):
        load(path)


def test_unknown_architecture_is_refused_naming_it(tmp_path: Path) -> None:
    """An architecture edgellm has no file for is refused at load, naming it, before any tensor is read."""
    mamba = {"general.architecture": "mamba"}
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides=mamba)
    with pytest.raises(
        UnsupportedArchitectureError, match=r"unsupported architecture 'mamba' \(supported: .*lfm2"
    ):
        load(path)


def test_lfm2_loads_and_has_oracle_cases(tmp_path: Path) -> None:
    """LiquidAI's LFM2 (short convolutions beside attention) loads: its layer kinds come from the per-layer
    head_count_kv (0: a conv layer); its logits match llama.cpp's in tests/gguf/test_oracle_cases.py (lfm2_*)
    and tests/gguf/test_lfm2.py."""
    from edgellm.testing.oracle.cases import CASES

    path = write_tiny_model(tmp_path / "m.gguf", "lfm2", n_layers=6)
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    assert cfg.conv_layers == [True, False, True, True, False, True] and cfg.n_kv_heads == 2
    assert cfg.recurrent and cfg.conv_l_cache == 3 and cfg.qk_norm
    assert cfg.n_kv_layers == 2  # the KV cache holds the attention layers only
    assert {"lfm2_f32", "lfm2_tied_q8_0", "lfm2_q4_k"} <= set(CASES)
    fixtures = Path(__file__).parent.parent / "fixtures" / "oracle"
    assert all((fixtures / f"{n}.npz").exists() for n in ("lfm2_f32", "lfm2_tied_q8_0", "lfm2_q4_k"))


def _lfm2_kv(counts: list[int]) -> dict:
    return {"lfm2.attention.head_count_kv": Typed(counts, GGUFValueType.ARRAY, GGUFValueType.INT32)}


@pytest.mark.parametrize(
    "kw, match",
    [
        # an attention layer's tensor in a conv layer (layer 0 is a conv layer)
        ({"extra_tensors": {"blk.0.attn_q.weight": (64, 64)}}, r"'blk.0.attn_q.weight' is not one a short"),
        ({"metadata_overrides": _lfm2_kv([0, 2, 0, 0, 1, 0])}, r"different KV head counts \[1, 2\]"),
        ({"metadata_overrides": {"lfm2.attention.sliding_window": Typed(8, U32)}}, r"sliding_window"),
        ({"metadata_overrides": {"lfm2.attention.causal": False}}, r"lfm2.attention.causal' = False"),
        ({"metadata_overrides": {"lfm2.shortconv.l_cache": None}}, r"missing metadata key 'lfm2.shortconv"),
        ({"extra_tensors": {"dense_2.weight": (64, 64)}}, r"tensor 'dense_2.weight' is not one edgellm"),
        ({"extra_tensors": {"blk.1.attn_q.bias": (64,)}}, r"attn_q.bias"),
    ],
)
def test_lfm2_variants_it_does_not_run_are_refused(tmp_path: Path, kw: dict, match: str) -> None:
    """A conv layer with attention tensors, attention layers of different KV widths, LFM2's
    sliding-window, bidirectional (ColBERT) and dense-output variants, and biases."""
    path = write_tiny_model(tmp_path / "m.gguf", "lfm2", n_layers=6, **kw)
    with pytest.raises(GGUFError, match=match):
        load(path)


def test_lfm2_conv_kernel_other_than_f32_is_refused(tmp_path: Path) -> None:
    """llama.cpp's ssm_conv reads the kernel as F32 (its converter and quantizer keep it so): a file
    with another type is refused rather than read as something else."""
    import dataclasses

    from gguf import GGMLQuantizationType

    g = load_gguf(str(write_tiny_model(tmp_path / "m.gguf", "lfm2", n_layers=3)))
    name = "blk.2.shortconv.conv.weight"
    g.tensors[name] = dataclasses.replace(g.tensors[name], qtype=GGMLQuantizationType.F16)
    with pytest.raises(GGUFError, match=r"'blk.2.shortconv.conv.weight' is F16: lfm2's conv kernel"):
        validate_model(g, config_from_gguf(g))
