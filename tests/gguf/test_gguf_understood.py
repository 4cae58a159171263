"""Loud by default (gguf/understood.py): a file holding a tensor or metadata key edgellm does not implement
is refused at load, naming it, instead of loading and giving other logits than llama.cpp's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from edgellm import LLM
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.synthetic.models import Typed, write_tiny_model


def load(path: Path) -> None:
    g = load_gguf(str(path))
    validate_model(g, config_from_gguf(g))


@pytest.mark.parametrize(
    "arch, name, shape",
    [
        ("qwen2", "blk.1.attn_output.bias", (64,)),  # llama.cpp reads it for llama only
        ("llama", "blk.0.attn_sinks.weight", (4,)),  # attention sinks (gpt-oss's)
        ("gemma3", "blk.0.ffn_gate_inp.weight", (4, 64)),  # a mixture-of-experts router
        ("qwen3", "blk.0.attn_q_norm.bias", (16,)),
    ],
)
def test_unknown_layer_tensor_is_refused(tmp_path: Path, arch: str, name: str, shape: tuple) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, extra_tensors={name: shape})
    role = name.split(".", 2)[2]
    with pytest.raises(
        GGUFError, match=rf"tensor '{name}' \({role}\) is not one edgellm implements for {arch}"
    ):
        load(path)


@pytest.mark.parametrize(
    "arch, name, shape",
    [
        ("qwen2", "output.bias", (288,)),
        ("gemma3", "dense_2.weight", (64, 64)),
        ("llama", "cls.weight", (2, 64)),
    ],
)
def test_unknown_global_tensor_is_refused(tmp_path: Path, arch: str, name: str, shape: tuple) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, extra_tensors={name: shape})
    with pytest.raises(GGUFError, match=rf"tensor '{name}' is not one edgellm implements for {arch}"):
        load(path)


def test_tensor_of_a_layer_past_block_count_is_refused(tmp_path: Path) -> None:
    """Multi-token-prediction files hold layers past block_count (nextn_predict_layers)."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3", extra_tensors={"blk.2.attn_norm.weight": (64,)})
    with pytest.raises(
        GGUFError, match=r"'blk\.2\.attn_norm\.weight' belongs to layer 2, but qwen3\.block_count is 2"
    ):
        load(path)


@pytest.mark.parametrize(
    "key, value",
    [
        ("llama.logit_scale", 0.5),  # granite's multipliers
        ("llama.embedding_scale", 12.0),
        ("qwen2.attention.sliding_window", 4),
        ("qwen3.attention.layer_norm_epsilon", 1e-06),  # LayerNorm, not RMSNorm
        ("gemma3.attn_logit_softcapping", 50.0),
        ("llama.attention.key_length_swa", 16),
    ],
)
def test_unknown_arch_key_is_refused(tmp_path: Path, key: str, value: object) -> None:
    arch = key.split(".")[0]
    path = write_tiny_model(tmp_path / "m.gguf", arch, metadata_overrides={key: value})
    with pytest.raises(GGUFError, match=rf"metadata key '{key}' \(= {value}\) is not one edgellm implements"):
        load(path)


@pytest.mark.parametrize(
    "key, harmless, refused",
    [
        ("qwen3.expert_count", 0, 8),  # llama reads it (Mixtral: tests/gguf/test_moe.py)
        ("qwen3.expert_used_count", 0, 2),
        ("gemma3.attention.causal", True, False),
        ("qwen2.nextn_predict_layers", 0, 1),
    ],
)
def test_arch_key_accepted_only_where_it_changes_nothing(
    tmp_path: Path, key: str, harmless: object, refused: object
) -> None:
    arch = key.split(".")[0]
    vtype = GGUFValueType.BOOL if isinstance(harmless, bool) else GGUFValueType.UINT32
    load(write_tiny_model(tmp_path / "ok.gguf", arch, metadata_overrides={key: Typed(harmless, vtype)}))
    path = write_tiny_model(tmp_path / "bad.gguf", arch, metadata_overrides={key: Typed(refused, vtype)})
    with pytest.raises(
        GGUFError, match=rf"'{key}' = {refused} is not implemented \(accepted only as {harmless}"
    ):
        load(path)


# Rope (gguf/rope.py reads the keys; tests/kernels/test_rope.py has their refusals): the scaling keys load,
# the tensors of rope variants edgellm lacks, or on an architecture llama.cpp does not read them for, do not.
def test_rope_scaling_keys_load(tmp_path: Path) -> None:
    yarn = {
        "qwen3.rope.scaling.type": "yarn",
        "qwen3.rope.scaling.factor": 4.0,
        "qwen3.rope.scaling.attn_factor": 1.2,
        "qwen3.rope.scaling.original_context_length": Typed(32768, GGUFValueType.UINT32),
        "qwen3.rope.scaling.finetuned": True,
    }
    load(write_tiny_model(tmp_path / "yarn.gguf", "qwen3", metadata_overrides=yarn))
    swa = {"gemma3.rope.freq_base_swa": 20000.0, "gemma3.rope.scaling.factor": 8.0}
    load(write_tiny_model(tmp_path / "g.gguf", "gemma3", metadata_overrides=swa))
    load(
        write_tiny_model(
            tmp_path / "l.gguf", "llama", extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)}
        )
    )


@pytest.mark.parametrize(
    "arch, name",
    [
        ("llama", "rope_factors_long.weight"),  # LongRoPE (Phi-3): not implemented
        ("llama", "rope_factors_short.weight"),
        ("qwen3", "rope_freqs.weight"),  # llama.cpp reads llama3 factors for llama only
        ("gemma3", "rope_freqs.weight"),
    ],
)
def test_rope_tensor_edgellm_does_not_apply_is_refused(tmp_path: Path, arch: str, name: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", arch, extra_tensors={name: np.ones(8, np.float32)})
    with pytest.raises(GGUFError, match=rf"tensor '{name}' is not one edgellm implements for {arch}"):
        load(path)


def test_gemma3_swa_base_key_is_refused_elsewhere(tmp_path: Path) -> None:
    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", metadata_overrides={"llama.rope.freq_base_swa": 1e4}
    )
    with pytest.raises(GGUFError, match=r"'llama\.rope\.freq_base_swa' \(= 10000\.0\) is not one edgellm"):
        load(path)


@pytest.mark.parametrize(
    "key, harmless, refused",
    [
        ("tokenizer.ggml.remove_extra_whitespaces", False, True),
        ("tokenizer.ggml.add_sep_token", False, True),
    ],
)
def test_other_key_accepted_only_where_it_changes_nothing(
    tmp_path: Path, key: str, harmless: object, refused: object
) -> None:
    load(write_tiny_model(tmp_path / "ok.gguf", "llama", metadata_overrides={key: harmless}))
    path = write_tiny_model(tmp_path / "bad.gguf", "llama", metadata_overrides={key: refused})
    with pytest.raises(GGUFError, match=rf"'{key}' = {refused} is not implemented"):
        load(path)


def test_non_empty_suppress_tokens_is_refused(tmp_path: Path) -> None:
    key = "tokenizer.ggml.suppress_tokens"
    path = write_tiny_model(tmp_path / "bad.gguf", "llama", metadata_overrides={key: [5, 7]})
    with pytest.raises(GGUFError, match=rf"'{key}' = an array of 2 .* \(accepted only as an empty array"):
        load(path)


def test_unknown_key_outside_the_arch_is_refused_and_bookkeeping_loads(tmp_path: Path) -> None:
    bookkeeping = {
        "general.source.url": "https://example.com",
        "quantize.imatrix.file": "imatrix.dat",
        "quantize.imatrix.chunks_count": Typed(125, GGUFValueType.INT32),
        "tokenizer.chat_template.tool_use": "{{ messages }}",
        "tokenizer.ggml.prefix_token_id": Typed(1, GGUFValueType.UINT32),
    }
    load(write_tiny_model(tmp_path / "ok.gguf", "qwen2", metadata_overrides=bookkeeping))
    path = write_tiny_model(tmp_path / "bad.gguf", "qwen2", metadata_overrides={"adapter.type": "lora"})
    with pytest.raises(
        GGUFError, match=r"metadata key 'adapter\.type' \(= 'lora'\) is not one edgellm implements"
    ):
        load(path)


def test_llm_refuses_before_starting_a_process(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", extra_tensors={"blk.0.attn_sinks.weight": (4,)})
    with pytest.raises(GGUFError, match=r"'blk\.0\.attn_sinks\.weight'"):
        LLM(path, n_ctx=64, kv_cache_memory=1 << 20)


def test_real_models_carry_nothing_refused(smollm2_path: Path, gemma3_path: Path) -> None:
    load(smollm2_path)
    load(gemma3_path)


@pytest.mark.parametrize(
    "pattern, local",
    [
        (None, "1111101"),  # llama.cpp's default period 6
        (Typed(3, GGUFValueType.UINT32), "1101101"),
        (Typed(0, GGUFValueType.UINT32), "1111111"),
        (Typed([False, True] * 3 + [True], GGUFValueType.ARRAY, GGUFValueType.BOOL), "0101011"),
    ],
)
def test_gemma3_local_layers_follow_the_sliding_window_pattern(
    tmp_path: Path, pattern: object, local: str
) -> None:
    key = "gemma3.attention.sliding_window_pattern"
    overrides = {} if pattern is None else {key: pattern}
    g = load_gguf(
        str(write_tiny_model(tmp_path / "m.gguf", "gemma3", n_layers=7, metadata_overrides=overrides))
    )
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    assert "".join(str(int(f)) for f in cfg.swa_layers) == local


def test_gemma3_pattern_flags_for_other_layers_are_refused(tmp_path: Path) -> None:
    flags = Typed([True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    key = "gemma3.attention.sliding_window_pattern"
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", n_layers=7, metadata_overrides={key: flags})
    with pytest.raises(GGUFError, match=rf"{key} has 3 per-layer flags for 7 layers"):
        load(path)


def test_gemma3_without_a_window_has_no_local_layers(tmp_path: Path) -> None:
    overrides = {"gemma3.attention.sliding_window": None}
    g = load_gguf(
        str(write_tiny_model(tmp_path / "m.gguf", "gemma3", n_layers=7, metadata_overrides=overrides))
    )
    assert config_from_gguf(g).swa_layers == [False] * 7
