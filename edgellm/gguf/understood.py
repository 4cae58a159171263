"""What a GGUF file may carry: per architecture, the tensors and metadata keys edgellm implements.

A file is refused at load, naming the tensor or key, when it holds anything else: llama.cpp's loaders read
optional tensors (biases, rope factors) and keys (rope scaling, attention variants) that change the logits,
and a loader that ignored what it does not know would give wrong logits with no complaint. So the rule is
an allowlist, not a list of known-bad names: a tensor is accepted only when its architecture's spec
(edgellm/arch/<name>.py SPEC: block_tensors, global_tensors) lists it, a `{arch}.*` key only when every
architecture reads it (COMMON_KEYS, ROPE_KEYS) or its spec lists it (ArchSpec.keys) or it holds the value at
which llama.cpp's math is unchanged (HARMLESS_AT, ROPE_HARMLESS_AT), and every other key only when it is
bookkeeping or tokenizer metadata (OTHER_KEYS, OTHER_PREFIXES).

Rope keys and tensors are kept apart (the ROPE_* tables; gguf/rope.py reads them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.gguf.metadata import describe
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import FREQ_FACTORS_TENSOR

if TYPE_CHECKING:
    from edgellm.arch.spec import ArchSpec

# ---- {arch}.* keys ------------------------------------------------------------------------------------
# Keys config.py reads for every architecture (the suffix after "{arch}."); each architecture's spec lists
# the ones it adds (ArchSpec.keys).
COMMON_KEYS = frozenset(
    {
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "vocab_size",  # llama.cpp reads it only to name the model size; the vocabulary is the tokens'
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.layer_norm_rms_epsilon",
        "pooling_type",  # read for embeddings (engine/pooling.py refuses a type it does not pool)
    }
)
# Keys llama.cpp's common loader reads for every architecture, accepted at the values that leave the
# model a dense, causal, text-only transformer (llama-model.cpp load_hparams).
HARMLESS_AT: dict[str, tuple[Any, ...]] = {
    "expert_count": (0,),
    "expert_used_count": (0,),
    "expert_group_count": (0,),
    "expert_group_used_count": (0,),
    "nextn_predict_layers": (0,),
    "attention.causal": (True,),
}

# ---- rope -----------------------------------------------------------------------------------------------
# Rotary-embedding keys (after "{arch}.") and tensors edgellm implements (gguf/rope.py reads and checks
# them: scaling types none / linear / yarn, a "longrope" type refused there; the yarn_* keys and NTK alpha,
# which llama.cpp ignores for these architectures, only at the values it uses instead).
ROPE_KEYS = frozenset(
    {
        "rope.freq_base",
        "rope.dimension_count",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scale_linear",
        "rope.scaling.attn_factor",
        "rope.scaling.original_context_length",
        "rope.scaling.alpha",
        *(
            f"rope.scaling.yarn_{k}"
            for k in ("beta_fast", "beta_slow", "ext_factor", "attn_factor", "log_multiplier")
        ),
    }
)
# The global tensor llama3's frequency factors come in, where the spec reads it (LongRoPE's factor sets are
# in Phi-3's spec)
ROPE_TENSORS = frozenset({FREQ_FACTORS_TENSOR})
# Rope keys accepted at any value: finetuned is a flag llama.cpp reads and never uses.
ROPE_HARMLESS_AT: dict[str, tuple[Any, ...] | None] = {"rope.scaling.finetuned": None}

# ---- keys outside {arch}.* -----------------------------------------------------------------------------
# general.* describes the file (name, license, file type, alignment: read by the reader). quantize.* is the
# quantizer's bookkeeping (imatrix file, dataset, counts).
OTHER_PREFIXES = ("general.", "quantize.", "tokenizer.chat_template.")
OTHER_KEYS: dict[str, tuple[Any, ...] | None] = {
    # the tokenizer reads these (tokenizer/, validation.py)
    "tokenizer.ggml.model": None,
    "tokenizer.ggml.pre": None,
    "tokenizer.ggml.tokens": None,
    "tokenizer.ggml.token_type": None,
    "tokenizer.ggml.scores": None,
    "tokenizer.ggml.merges": None,
    "tokenizer.ggml.bos_token_id": None,
    "tokenizer.ggml.eos_token_id": None,
    "tokenizer.ggml.eot_token_id": None,
    "tokenizer.ggml.eom_token_id": None,
    "tokenizer.ggml.unknown_token_id": None,
    "tokenizer.ggml.padding_token_id": None,
    "tokenizer.ggml.add_bos_token": None,
    "tokenizer.ggml.add_eos_token": None,
    "tokenizer.ggml.add_space_prefix": None,
    "tokenizer.chat_template": None,
    # special-token ids for infilling and encoders: they name tokens, they do not change tokenization
    **dict.fromkeys(
        (
            f"tokenizer.ggml.{k}_token_id"
            for k in ("seperator", "cls", "mask", "prefix", "suffix", "middle")
            + tuple(f"fim_{f}" for f in ("pre", "suf", "mid", "pad", "rep", "sep"))
        ),
        None,
    ),
    "tokenizer.ggml.token_type_count": None,  # BERT's segment types
    "tokenizer.huggingface.json": None,  # the source tokenizer.json, which llama.cpp does not read
    # tokenization variants, accepted where they are off
    "tokenizer.ggml.add_sep_token": (False,),
    "tokenizer.ggml.remove_extra_whitespaces": (False,),
    "tokenizer.ggml.normalizer.lowercase": (False,),
    "tokenizer.ggml.normalizer.strip_accents": (False,),
    "tokenizer.ggml.suppress_tokens": ((),),  # () : an empty array
    # a split model's parts: the reader has joined them all (split.py), the first one's keys remain
    "split.no": (0,),
    "split.count": None,
    "split.tensors.count": None,
}

# WordPiece's normalizer options (tokenizer/wpm.py), and add_sep (it always adds [SEP], as llama.cpp's WPM)
WORDPIECE_KEYS = frozenset(
    {
        "tokenizer.ggml.normalizer.lowercase",
        "tokenizer.ggml.normalizer.strip_accents",
        "tokenizer.ggml.add_sep_token",
    }
)

_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")


def check_understood(g: GGUFFile, cfg: ModelConfig, spec: ArchSpec) -> None:
    """GGUFError naming the first tensor or metadata key of `g` that edgellm does not implement for its
    architecture (see the module doc); `spec`: the architecture's (edgellm/arch/<name>.py)."""
    arch = cfg.arch
    global_tensors = spec.global_tensors | (ROPE_TENSORS if spec.rope_freq_factors else frozenset())
    for name in g.tensors:
        _check_tensor_name(g, arch, cfg, name, global_tensors, spec.layer_tensors)
    arch_keys = COMMON_KEYS | spec.keys | ROPE_KEYS
    harmless = {**HARMLESS_AT, **ROPE_HARMLESS_AT}
    for key, value in g.metadata.items():
        if key.startswith(arch + "."):
            suffix = key[len(arch) + 1 :]
            if suffix in arch_keys:
                continue
            missing = _missing(arch, key_feature(suffix))
            _check_value(g, key, value, harmless, suffix, f"architecture {arch}", missing)
        elif not key.startswith(OTHER_PREFIXES):
            if key in WORDPIECE_KEYS and g.get("tokenizer.ggml.model") == "bert":
                continue  # tokenizer/wpm.py implements them
            _check_value(g, key, value, OTHER_KEYS, key, "a model file")


def _check_tensor_name(
    g: GGUFFile, arch: str, cfg: ModelConfig, name: str, global_tensors: frozenset[str], layer: frozenset[str]
) -> None:
    n_layers = cfg.n_layers
    m = _BLOCK_TENSOR.fullmatch(name)
    if m is None:
        if name in global_tensors:
            return
        known = sorted(global_tensors)
        raise GGUFError(
            f"{g.path}: {_missing(arch, tensor_feature(name))}tensor {name!r} is not one edgellm implements "
            f"for {arch} (it would change the "
            f"logits if applied and cannot be ignored; global tensors implemented: {', '.join(known)})"
        )
    il, role = int(m.group(1)), m.group(2)
    if n_layers <= il < n_layers + cfg.n_nextn_layers and (role in layer or role.startswith("nextn.")):
        return  # a multi-token prediction layer's: never read (ArchSpec.nextn_layers)
    if il >= n_layers:
        raise GGUFError(
            f"{g.path}: tensor {name!r} belongs to layer {il}, but {arch}.block_count is {n_layers} "
            "(extra layers, e.g. for multi-token prediction, are not implemented)"
        )
    if role not in layer:
        raise GGUFError(
            f"{g.path}: {_missing(arch, tensor_feature(role))}tensor {name!r} ({role}) is not one edgellm "
            f"implements for {arch} layers (it would "
            f"change the logits if applied and cannot be ignored; layer tensors implemented: "
            f"{', '.join(sorted(layer))})"
        )


def _missing(arch: str, feature: str | None) -> str:
    """'arch: feature not implemented; ' to open a refusal, where arch/unsupported.py names the feature the
    tensor or key carries (what a user looks up), '' where it does not."""
    return "" if feature is None else f"{arch}: {feature} not implemented; "


def tensor_feature(role: str) -> str | None:
    from edgellm.arch.registry import tensor_feature  # arch/ imports this package

    return tensor_feature(role)


def key_feature(suffix: str) -> str | None:
    from edgellm.arch.registry import key_feature

    return key_feature(suffix)


def _check_value(
    g: GGUFFile,
    key: str,
    value: Any,
    table: Mapping[str, tuple[Any, ...] | None],
    entry: str,
    what: str,
    missing: str = "",
) -> None:
    if entry not in table:
        raise GGUFError(
            f"{g.path}: {missing}metadata key {key!r} (= {_show(value)}) is not one edgellm implements for "
            f"{what}: "
            "it may change how the model computes, so the file is refused rather than run differently "
            "from llama.cpp"
        )
    allowed = table[entry]
    if allowed is None or any(_same(value, a) for a in allowed):
        return
    raise GGUFError(
        f"{g.path}: {missing}metadata key {key!r} = {_show(value)} is not implemented (accepted only as "
        f"{' or '.join(_show(a) for a in allowed)}, where it changes nothing)"
    )


def _same(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, tuple):  # an empty array
        return isinstance(value, list | np.ndarray) and len(value) == 0
    if isinstance(allowed, str):
        return isinstance(value, str) and value == allowed
    return not isinstance(value, str | list | np.ndarray) and value == allowed


def _show(value: Any) -> str:
    if isinstance(value, float):
        return str(np.float32(value))  # the shortest form of the file's float32, not of its float64 widening
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        return "an empty array"
    if isinstance(value, list | np.ndarray):
        return describe(value)
    return str(value)
