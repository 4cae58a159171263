"""Refusals name the missing feature: every entry of arch/unsupported.py's tables, put in a tiny file, is
refused at load with a message that names the feature (the architecture's list, or the one feature a tensor
or key carries), not only the architecture or the tensor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gguf import GGUFValueType

from edgellm.arch.registry import supported_architectures
from edgellm.arch.unsupported import ARCHITECTURES, KEY_FEATURES, TENSOR_FEATURES
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.model_config import UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import validate_model
from edgellm.testing.synthetic.models import Typed, write_tiny_model


def load(path: Path) -> None:
    g = load_gguf(str(path))
    validate_model(g, config_from_gguf(g))


def concrete(pattern: str) -> str:
    """A name the table entry matches: 'altup_*' -> 'altup_x.weight', 'ssm.*' -> 'ssm.x'."""
    return (
        pattern[:-1] + ("x" if pattern.endswith(".*") else "x.weight") if pattern.endswith("*") else pattern
    )


def test_no_architecture_is_both_supported_and_refused() -> None:
    both = set(ARCHITECTURES) & set(supported_architectures())
    assert not both, f"{sorted(both)}: implemented in edgellm/arch/, still listed in arch/unsupported.py"


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_unsupported_architecture_names_its_features(tmp_path: Path, arch: str) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides={"general.architecture": arch})
    with pytest.raises(UnsupportedArchitectureError) as err:
        load(path)
    message = str(err.value)
    assert f"unsupported architecture {arch!r}" in message
    assert f"not implemented: {arch}: " + ", ".join(ARCHITECTURES[arch]) in message


def test_unknown_architecture_names_the_features_its_tensors_and_keys_carry(tmp_path: Path) -> None:
    """An architecture missing from the table: the features are read off its tensors and keys."""
    md = {"general.architecture": "newmla", "newmla.attention.kv_lora_rank": Typed(8, GGUFValueType.UINT32)}
    extra = {"blk.0.exp_probs_b.bias": (4,)}
    path = write_tiny_model(tmp_path / "m.gguf", "llama", metadata_overrides=md, extra_tensors=extra)
    with pytest.raises(UnsupportedArchitectureError, match=r"unsupported architecture 'newmla'") as err:
        load(path)
    assert (
        f"not implemented: newmla: {TENSOR_FEATURES['exp_probs_b.bias']}, "
        f"{KEY_FEATURES['attention.kv_lora_rank']}" in str(err.value)
    )


@pytest.mark.parametrize("role", sorted(TENSOR_FEATURES))
def test_tensor_refusal_names_its_feature(tmp_path: Path, role: str) -> None:
    # a per-layer role in layer 0; the roles without a "blk." form (per_layer_token_embd, cls) as globals
    name = concrete(role)
    tensor = name if name.startswith(("per_layer_", "cls.", "token_types")) else f"blk.0.{name}"
    path = write_tiny_model(tmp_path / "m.gguf", "llama", extra_tensors={tensor: (4,)})
    feature = re.escape(f"llama: {TENSOR_FEATURES[role]} not implemented; tensor '{tensor}'")
    with pytest.raises(GGUFError, match=feature):
        load(path)


@pytest.mark.parametrize("suffix", sorted(KEY_FEATURES))
def test_key_refusal_names_its_feature(tmp_path: Path, suffix: str) -> None:
    key = "llama." + concrete(suffix).removesuffix(".weight")
    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", metadata_overrides={key: Typed(3, GGUFValueType.UINT32)}
    )
    feature = re.escape(f"llama: {KEY_FEATURES[suffix]} not implemented; metadata key '{key}'")
    with pytest.raises(GGUFError, match=feature):
        load(path)
