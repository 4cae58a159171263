"""What a GGUF file may carry: per architecture, the tensors and metadata keys edgellm implements.

A file is refused at load, naming the tensor or key, when it holds anything else: llama.cpp's loaders read
optional tensors (biases, rope factors) and keys (rope scaling, attention variants) that change the logits,
and a loader that ignored what it does not know would give wrong logits with no complaint. So the rule is
an allowlist, not a list of known-bad names: a tensor is accepted only when its architecture's table
lists it, a `{arch}.*` key only when the architecture's table lists it (config.py reads it) or it holds the
value at which llama.cpp's math is unchanged (HARMLESS_AT, ROPE_HARMLESS_AT), and every other key only when
it is bookkeeping or tokenizer metadata (OTHER_KEYS, OTHER_PREFIXES).

Rope keys and tensors are kept apart (the ROPE_* tables; gguf/rope.py reads them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgellm.gguf.config import ModelConfig
from edgellm.gguf.metadata import describe
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import FREQ_FACTOR_ARCHS, FREQ_FACTORS_TENSOR, LONGROPE_ARCHS, LONGROPE_TENSORS

# ---- tensors --------------------------------------------------------------------------------------------
# Per-layer tensors (the name after "blk.N."), as llama.cpp's src/models/<arch>.cpp creates them.
_LLAMA_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)
# Optional Q/K/V biases: llama.cpp's create_tensor_qkv reads them for every architecture (required here
# for qwen2 only, whose converter always writes them); output-projection and FFN biases: llama only.
_QKV_BIASES = frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"})
_LLAMA_BIASES = frozenset({"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"})
_QK_NORMS = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})
_POST_NORMS = frozenset({"post_attention_norm.weight", "post_ffw_norm.weight"})

# A mixture-of-experts FFN in place of the dense one: the router and the experts' 3-D matrices
_EXPERTS = frozenset(
    {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
)
_DENSE_FFN = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
# Qwen 2 MoE's shared expert and its sigmoid gate
_SHARED_EXPERT = frozenset(
    {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"}
)

# gpt-oss (llama_model_openai_moe): biased attention with sinks, post_attention_norm as the FFN's pre-norm,
# a biased router and biased experts; every bias but Q/K/V's required (validation.py)
_GPT_OSS_BLOCK = (
    (_LLAMA_BLOCK - _DENSE_FFN - {"ffn_norm.weight"})
    | _QKV_BIASES
    | _EXPERTS
    | {"attn_output.bias", "attn_sinks.weight", "post_attention_norm.weight", "ffn_gate_inp.bias"}
    | {f"ffn_{m}_exps.bias" for m in ("gate", "up", "down")}
)

BLOCK_TENSORS: dict[str, frozenset[str]] = {
    "llama": _LLAMA_BLOCK | _QKV_BIASES | _LLAMA_BIASES | _EXPERTS,  # Mixtral: experts, no dense FFN
    "qwen2": _LLAMA_BLOCK | _QKV_BIASES,
    "qwen3": _LLAMA_BLOCK | _QKV_BIASES | _QK_NORMS,
    "gemma3": _LLAMA_BLOCK | _QKV_BIASES | _QK_NORMS | _POST_NORMS,
    "gemma2": _LLAMA_BLOCK | _QKV_BIASES | _POST_NORMS,
    "granite": _LLAMA_BLOCK | _QKV_BIASES | _LLAMA_BIASES,  # llama_model_granite's optional biases
    # no attn_norm / ffn_norm: OLMo 2 norms after each block (Q/K norms over the whole projection)
    "olmo2": (_LLAMA_BLOCK - {"attn_norm.weight", "ffn_norm.weight"}) | _QKV_BIASES | _QK_NORMS | _POST_NORMS,
    # gate|up fused into ffn_up (2 * n_ff rows); no other bias than Q|K|V's (llama_model_phi3)
    "phi3": (_LLAMA_BLOCK - {"ffn_gate.weight"}) | _QKV_BIASES,
    "smollm3": _LLAMA_BLOCK | _QKV_BIASES,  # the graph reads output / FFN biases, the loader creates none
    "qwen3moe": (_LLAMA_BLOCK - _DENSE_FFN) | _QKV_BIASES | _QK_NORMS | _EXPERTS,
    "olmoe": (_LLAMA_BLOCK - _DENSE_FFN) | _QKV_BIASES | _QK_NORMS | _EXPERTS,
    "qwen2moe": (_LLAMA_BLOCK - _DENSE_FFN) | _QKV_BIASES | _EXPERTS | _SHARED_EXPERT,
    "gpt-oss": _GPT_OSS_BLOCK,
}
# LayerNorm architectures: every norm has a bias; the MLP is up -> GELU -> down (no ffn_gate), every
# matrix biased. StarCoder 2 has separate Q/K/V, GPT-2 one fused attn_qkv.
_LN_NORMS = frozenset({"attn_norm.weight", "attn_norm.bias", "ffn_norm.weight", "ffn_norm.bias"})
_LN_REST = frozenset(
    f"{m}.{part}" for m in ("attn_output", "ffn_up", "ffn_down") for part in ("weight", "bias")
)
BLOCK_TENSORS["starcoder2"] = (
    _LN_NORMS | _LN_REST | _QKV_BIASES | {"attn_q.weight", "attn_k.weight", "attn_v.weight"}
)
BLOCK_TENSORS["gpt2"] = _LN_NORMS | _LN_REST | {"attn_qkv.weight", "attn_qkv.bias"}
# LFM2: attention layers (no biases: llama.cpp asserts none in its FFN and its graph adds none) and short-conv
# layers; gguf/lfm2.py checks that each layer has only its own kind's
_SHORTCONV = frozenset({"shortconv.in_proj.weight", "shortconv.conv.weight", "shortconv.out_proj.weight"})
BLOCK_TENSORS["lfm2"] = _LLAMA_BLOCK | _QK_NORMS | _SHORTCONV
# Q|K|V as one matrix (and its bias): llama.cpp's create_tensor_qkv reads attn_qkv.weight in place of the
# three for these architectures, per layer; validation.py refuses a layer with both forms.
FUSED_QKV_ARCHS = (
    "llama", "qwen2", "qwen3", "gemma2", "gemma3", "granite", "olmo2", "phi3", "smollm3", "gpt-oss"
)  # fmt: skip
BLOCK_TENSORS.update({a: BLOCK_TENSORS[a] | {"attn_qkv.weight", "attn_qkv.bias"} for a in FUSED_QKV_ARCHS})
_GLOBAL = frozenset({"token_embd.weight", "output_norm.weight", "output.weight"})
GLOBAL_TENSORS: dict[str, frozenset[str]] = {arch: _GLOBAL for arch in BLOCK_TENSORS}
GLOBAL_TENSORS["starcoder2"] = _GLOBAL | {"output_norm.bias"}
GLOBAL_TENSORS["gpt2"] = _GLOBAL | {"output_norm.bias", "position_embd.weight"}
# llama.cpp's Gemma 2 always projects with token_embd.weight: an output.weight would go unused there
GLOBAL_TENSORS["gemma2"] = _GLOBAL - {"output.weight"}
GLOBAL_TENSORS["lfm2"] = _GLOBAL - {"output_norm.weight"} | {"token_embd_norm.weight"}  # the final norm

# ---- {arch}.* keys ------------------------------------------------------------------------------------
# Keys config.py reads (the suffix after "{arch}.").
_COMMON_KEYS = frozenset(
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
# Mixture of experts (arch_config.read_experts reads them)
# (llama's and OLMoE's experts are feed_forward_length wide: llama.cpp reads no expert width for them)
_EXPERT_KEYS = frozenset({"expert_count", "expert_used_count"})
ARCH_KEYS: dict[str, frozenset[str]] = {
    "llama": _COMMON_KEYS | _EXPERT_KEYS,
    "qwen3moe": _COMMON_KEYS | _EXPERT_KEYS | {"expert_feed_forward_length"},
    "olmoe": _COMMON_KEYS | _EXPERT_KEYS,
    "qwen2moe": _COMMON_KEYS
    | _EXPERT_KEYS
    | {"expert_feed_forward_length", "expert_shared_feed_forward_length"},
    "qwen2": _COMMON_KEYS,
    "qwen3": _COMMON_KEYS,
    "gemma3": _COMMON_KEYS
    | {"attention.sliding_window", "attention.sliding_window_pattern", "final_logit_softcapping"},
    "gemma2": _COMMON_KEYS
    | {
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "rope.freq_base_swa",
    },
    "granite": _COMMON_KEYS | {"embedding_scale", "residual_scale", "attention.scale", "logit_scale"},
    "olmo2": _COMMON_KEYS
    | {"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"},
    "starcoder2": _COMMON_KEYS | {"attention.layer_norm_epsilon"},
    "gpt2": _COMMON_KEYS | {"attention.layer_norm_epsilon"},
    "phi3": _COMMON_KEYS | {"attention.sliding_window"},  # read and unused, as llama.cpp's Phi-3
    "smollm3": _COMMON_KEYS,
    "lfm2": _COMMON_KEYS | {"shortconv.l_cache"},
    "gpt-oss": _COMMON_KEYS
    | _EXPERT_KEYS
    | {
        "expert_feed_forward_length",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "rope.freq_base_swa",
    },
}
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
ARCH_ROPE_KEYS: dict[str, frozenset[str]] = {"gemma3": frozenset({"rope.freq_base_swa"})}
# Global tensors: llama3's frequency factors and LongRoPE's two factor sets where llama.cpp reads them.
ROPE_TENSORS: dict[str, frozenset[str]] = {
    arch: frozenset(
        ({FREQ_FACTORS_TENSOR} if arch in FREQ_FACTOR_ARCHS else set())
        | (set(LONGROPE_TENSORS) if arch in LONGROPE_ARCHS else set())
    )
    for arch in BLOCK_TENSORS
}
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

_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")


def check_understood(g: GGUFFile, cfg: ModelConfig) -> None:
    """GGUFError naming the first tensor or metadata key of `g` that edgellm does not implement for its
    architecture (see the module doc)."""
    arch = cfg.arch
    for name in g.tensors:
        _check_tensor_name(g, arch, cfg.n_layers, name)
    arch_keys = ARCH_KEYS[arch] | ROPE_KEYS | ARCH_ROPE_KEYS.get(arch, frozenset())
    harmless = {**HARMLESS_AT, **ROPE_HARMLESS_AT}
    for key, value in g.metadata.items():
        if key.startswith(arch + "."):
            suffix = key[len(arch) + 1 :]
            if suffix in arch_keys:
                continue
            _check_value(g, key, value, harmless, suffix, f"architecture {arch}")
        elif not key.startswith(OTHER_PREFIXES):
            _check_value(g, key, value, OTHER_KEYS, key, "a model file")


def _check_tensor_name(g: GGUFFile, arch: str, n_layers: int, name: str) -> None:
    m = _BLOCK_TENSOR.fullmatch(name)
    if m is None:
        if name in GLOBAL_TENSORS[arch] or name in ROPE_TENSORS[arch]:
            return
        known = sorted(GLOBAL_TENSORS[arch] | ROPE_TENSORS[arch])
        raise GGUFError(
            f"{g.path}: tensor {name!r} is not one edgellm implements for {arch} (it would change the "
            f"logits if applied and cannot be ignored; global tensors implemented: {', '.join(known)})"
        )
    il, role = int(m.group(1)), m.group(2)
    if il >= n_layers:
        raise GGUFError(
            f"{g.path}: tensor {name!r} belongs to layer {il}, but {arch}.block_count is {n_layers} "
            "(extra layers, e.g. for multi-token prediction, are not implemented)"
        )
    if role not in BLOCK_TENSORS[arch]:
        raise GGUFError(
            f"{g.path}: tensor {name!r} ({role}) is not one edgellm implements for {arch} layers (it would "
            f"change the logits if applied and cannot be ignored; layer tensors implemented: "
            f"{', '.join(sorted(BLOCK_TENSORS[arch]))})"
        )


def _check_value(
    g: GGUFFile, key: str, value: Any, table: Mapping[str, tuple[Any, ...] | None], entry: str, what: str
) -> None:
    if entry not in table:
        raise GGUFError(
            f"{g.path}: metadata key {key!r} (= {_show(value)}) is not one edgellm implements for {what}: "
            "it may change how the model computes, so the file is refused rather than run differently "
            "from llama.cpp"
        )
    allowed = table[entry]
    if allowed is None or any(_same(value, a) for a in allowed):
        return
    raise GGUFError(
        f"{g.path}: metadata key {key!r} = {_show(value)} is not implemented (accepted only as "
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
