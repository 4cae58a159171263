"""Gemma 2, Granite and OLMo 2 files edgellm does not run as llama.cpp would are refused at load, naming why
(the logits of the ones it runs: tests/test_oracle_cases.py, cases gemma2_*, granite_* and olmo2_*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.reader import GGUFError, load_gguf
from edgellm.gguf.validation import validate_model
from edgellm.testing.synthetic import write_tiny_model


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
