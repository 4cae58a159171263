"""What the oracle cases of mistral3, seed_oss, glm4moe, deepseek2 and llama4 (test_oracle_cases.py) cannot
show: the limits each file sets, the keys llama.cpp requires, and the latent KV cache's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.model_config import UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.oracle.cases import CASES
from edgellm.testing.synthetic.models import Typed, write_tiny_model


def config(path: Path):  # noqa: ANN201
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    return cfg


def test_llama4_refuses_contexts_past_its_first_chunk(tmp_path: Path) -> None:
    """Within 8192 positions llama.cpp's chunked attention is causal attention; past them it is not, and
    edgellm has no chunked mask: a larger context is refused, not run differently."""
    cfg = config(CASES["llama4_mix"].write(tmp_path / "l4.gguf"))
    cfg.set_context(8192)
    with pytest.raises(UnsupportedArchitectureError, match=r"chunked attention past 8192 tokens"):
        cfg.set_context(8193)


def test_llama4_without_chunks_is_refused(tmp_path: Path) -> None:
    md = {"llama4.attention.sliding_window": Typed(0, GGUFValueType.UINT32)}
    path = write_tiny_model(tmp_path / "l4.gguf", "llama4", metadata_overrides=md, n_expert=4)
    with pytest.raises(GGUFError, match=r"sliding_window = 0 \(no chunked attention\) is not implemented"):
        config(path)


def test_deepseek2_needs_the_q_lora_rank_except_of_the_lite_shapes(tmp_path: Path) -> None:
    """llama.cpp reads attention.q_lora_rank as required unless the model has a V2-Lite shape."""
    path = write_tiny_model(
        tmp_path / "d.gguf", "deepseek2", metadata_overrides={"deepseek2.attention.q_lora_rank": None}
    )
    with pytest.raises(GGUFError, match=r"deepseek2\.attention\.q_lora_rank"):
        config(path)


def test_deepseek2_caches_the_latent_not_the_expanded_heads(tmp_path: Path) -> None:
    """MLA's cache holds one KV head a token: K = the latent (kv_lora_rank) and the rotated key, V = the
    latent; the expanded per-head K/V (n_heads x key_length_mla) is never stored."""
    cfg = config(CASES["deepseek2_v3_f32"].write(tmp_path / "d.gguf"))
    r, n_rot = cfg.mla_kv_lora_rank, cfg.rope_dim
    assert (cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v) == (1, r + n_rot, r)
    assert cfg.n_kv_heads * (cfg.head_dim + cfg.head_dim_v) < cfg.n_heads * (
        cfg.mla_head_dim_k + cfg.mla_head_dim_v
    )


def test_an_mtp_layer_is_skipped_but_a_tensor_past_it_is_refused(tmp_path: Path) -> None:
    case = CASES["glm4moe_nextn"]
    cfg = config(case.write(tmp_path / "g.gguf"))
    assert cfg.n_layers == 3 and cfg.n_nextn_layers == 1
    extra = {**case.extra_tensors, "blk.4.nextn.enorm.weight": (64,)}
    path = write_tiny_model(tmp_path / "bad.gguf", "glm4moe", metadata_overrides=dict(case.metadata),
                            extra_tensors=extra, **case.model, **case.writer)  # fmt: skip
    with pytest.raises(GGUFError, match=r"'blk\.4\.nextn\.enorm\.weight' belongs to layer 4"):
        config(path)


def test_deepseek2_latent_past_512_loads_on_the_cpu_only(tmp_path: Path) -> None:
    """The released files' latent K (576) passes the 512 head bound only for deepseek2, whose attention
    runs on the CPU backend there (its scratch is sized by the head); another backend refuses it by name,
    before any kernel could run past the CUDA kernel's shared-memory head."""
    from types import SimpleNamespace

    from edgellm.arch.deepseek2 import DeepSeek2Model

    path = CASES["deepseek2_wide_latent"].write(tmp_path / "w.gguf")
    g = load_gguf(str(path))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    assert cfg.head_dim == 768 > 512
    with pytest.raises(UnsupportedArchitectureError, match=r"exceeds the cuda backend's attention bound"):
        DeepSeek2Model(cfg, g, SimpleNamespace(name="cuda"))
    llama = write_tiny_model(tmp_path / "l.gguf", "llama", n_heads=1, n_kv_heads=1, head_dim=576, n_embd=64)
    with pytest.raises(GGUFError, match=r"key_length.* must be 1\.\.512|out of range"):
        config(llama)
