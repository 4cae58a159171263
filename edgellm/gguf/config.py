"""Model hyper-parameters from GGUF metadata (keys as llama.cpp's converters write them): the keys every
architecture shares here, what each one adds as its spec says (edgellm/arch/<name>.py SPEC, found through
arch/registry.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from edgellm.gguf.metadata import INT32_MAX, check_int_range, describe, get_float, get_int, get_str, is_int
from edgellm.gguf.model_config import (
    MAX_HEAD_DIM,
    ROPE_NEOX,
    ModelConfig,
    UnsupportedArchitectureError,
)
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import rope_from_gguf

if TYPE_CHECKING:
    from edgellm.arch.spec import ArchSpec

# {arch}.pooling_type, llama.cpp's enum llama_pooling_type. NONE (per-token vectors) is what a plain
# language model's file says, or nothing: its one-vector embedding is the mean here. Generation ignores the
# key, so a value this table lacks loads and only embeddings refuse it.
POOLING_TYPES = {0: "mean", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# A context of one position leaves no room to generate after a single prompt token.
MIN_CONTEXT_LENGTH = 2


def _head_count_kv(g: GGUFFile, p: str, n_heads: int, n_layers: int) -> int:
    """head_count_kv: a scalar, or a per-layer array (some converters write one) whose entries must be equal,
    since every layer shares one KV cache shape here."""
    key = p + "attention.head_count_kv"
    value = g.get(key, n_heads)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        if len(value) != n_layers or len(set(value.tolist())) != 1:
            raise GGUFError(
                f"{g.path}: metadata {key} is a per-layer array {value.tolist()[:8]} of {len(value)} "
                f"entries: supported only with {n_layers} equal entries"
            )
        value = int(value[0])
    if not is_int(value):
        raise GGUFError(f"{g.path}: metadata {key} must be an integer, got {describe(value)}")
    return check_int_range(g, key, int(value), 1, n_heads, f"{p}attention.head_count = {n_heads}")


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    """The hyper-parameters, each read with its type and range checked (metadata.py); shapes that depend
    on several keys and on the tensors are checked by validation.validate_model."""
    arch = g.architecture
    spec = arch_spec_of(g)
    p = f"{arch}."
    # Every layer has tensors of its own, so the file's tensor count bounds the layers; every width is
    # the length of some tensor's rows, so the file size bounds it.
    n_tensors, size = len(g.tensors), g.file_size
    n_layers = get_int(
        g, p + "block_count", lo=1, hi=max(1, n_tensors), why=f"{n_tensors} tensors in the file"
    )
    n_nextn = 0
    if spec.nextn_layers:  # the last block_count layers: multi-token prediction, which llama.cpp skips
        n_nextn = get_int(g, p + "nextn_predict_layers", 0, lo=0, hi=n_layers - 1)
        n_layers -= n_nextn
    n_embd = get_int(g, p + "embedding_length", lo=1, hi=size, why="bounded by the file size")
    n_heads = get_int(g, p + "attention.head_count", lo=1, hi=size, why="bounded by the file size")
    if spec.head_counts is not None:  # LFM2: a per-layer array whose zeros mark the short-conv layers
        n_kv_heads, conv_layers = spec.head_counts(g, n_heads, n_layers)
    else:
        n_kv_heads, conv_layers = _head_count_kv(g, p, n_heads, n_layers), [False] * n_layers
    if n_heads % n_kv_heads:
        raise GGUFError(
            f"{g.path}: {n_heads} attention heads are not a multiple of {n_kv_heads} KV heads "
            f"({p}attention.head_count={n_heads}, {p}attention.head_count_kv={n_kv_heads})"
        )
    default_head = n_embd // n_heads
    if p + "attention.key_length" not in g.metadata and not 1 <= default_head <= MAX_HEAD_DIM:
        raise GGUFError(
            f"{g.path}: head size {p}embedding_length / {p}attention.head_count = {n_embd} / {n_heads} "
            f"= {default_head} is out of range: must be 1..{MAX_HEAD_DIM}"
        )
    head_dim = get_int(g, p + "attention.key_length", default_head, lo=1, hi=spec.max_head_dim)
    head_dim_v = get_int(g, p + "attention.value_length", head_dim, lo=1, hi=spec.max_head_dim)
    rope_key = p + "rope.dimension_count"
    rope_dim = get_int(g, rope_key, head_dim, hi=2**64)  # the range check below names the head size
    if not (2 <= rope_dim <= head_dim and rope_dim % 2 == 0):
        raise GGUFError(
            f"{g.path}: metadata {rope_key} = {rope_dim}{'' if rope_key in g.metadata else ' (its default)'} "
            f"must be even, at least 2 and at most the head size {head_dim} (the rotary embedding rotates "
            "pairs of a head's dims)"
        )
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else 0
    if "token_embd.weight" in g.tensors:
        n_vocab = g.tensors["token_embd.weight"].shape[0]
        if isinstance(tokens, list) and len(tokens) != n_vocab:
            raise GGUFError(
                f"{g.path}: tensor 'token_embd.weight' has {n_vocab} rows but the vocabulary has "
                f"{len(tokens)} tokens"
            )
    rope_type = spec.rope_type
    n_ctx_train = get_int(g, p + "context_length", 2048, lo=MIN_CONTEXT_LENGTH, hi=INT32_MAX)
    sliding_window = 0
    if spec.sliding_window:
        window_default = spec.sliding_window_default
        default_kw = {} if window_default is None else {"default": window_default}
        sliding_window = get_int(g, p + "attention.sliding_window", lo=0, hi=INT32_MAX, **default_kw)
    neox = rope_type == ROPE_NEOX
    rope, rope_swa = rope_from_gguf(
        g,
        arch,
        rope_dim,
        neox,
        n_ctx_train,
        sliding_window > 0,
        spec.rope_freq_factors,
        spec.swa_rope,
        spec.yarn_keys,
    )
    cfg = ModelConfig(
        arch=arch,
        name=get_str(g, "general.name", g.path.stem),
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=_dense_width(g, spec, size),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        rms_eps=get_float(g, p + "attention.layer_norm_rms_epsilon", 1e-5, lo=0.0, hi=1.0, lo_open=True),
        rope=rope,
        rope_swa=rope_swa,
        rope_dim=rope_dim,
        rope_type=rope_type,
        attn_scale=1.0 / math.sqrt(head_dim),
        swa_layers=[False] * n_layers,
        qkv_fused=[f"blk.{il}.attn_qkv.weight" in g.tensors for il in range(n_layers)],
        pooling=POOLING_TYPES.get(pooling_type := get_int(g, p + "pooling_type", 0), f"type {pooling_type}"),
        conv_layers=conv_layers,
    )
    cfg.sliding_window = sliding_window
    cfg.n_nextn_layers = n_nextn
    for name, value in spec.flags.items():
        setattr(cfg, name, value)
    if spec.experts is not None:
        spec.experts.read(g, cfg)
    if spec.read is not None:
        spec.read(g, cfg)
    if spec.no_rope_layer_step:
        step = spec.no_rope_layer_step
        cfg.no_rope_layers = [(il + 1) % step == 0 for il in range(n_layers)]
    return cfg


def _dense_width(g: GGUFFile, spec: ArchSpec, size: int) -> int:
    """{arch}.feed_forward_length: required, except where the spec says the architecture has no dense FFN
    (gpt-oss: llama.cpp reads the key as optional; here its experts' width stands in)."""
    key = spec.name + ".feed_forward_length"
    if not spec.dense_ffn_key and key not in g.metadata:
        key = spec.name + ".expert_feed_forward_length"
    return get_int(g, key, lo=1, hi=size, why="bounded by the file size")


def arch_spec_of(g: GGUFFile) -> ArchSpec:
    """The spec of the file's architecture (edgellm/arch/<name>.py); UnsupportedArchitectureError naming
    what the file needs that edgellm lacks (arch/unsupported.py: the architecture's features, then those
    its tensors and keys mark) and the architectures implemented, when it has none."""
    from edgellm.arch.registry import (  # arch/ imports gguf
        arch_spec,
        missing_features,
        supported_architectures,
    )

    arch = g.architecture
    spec = arch_spec(arch)
    if spec is None:
        roles = [name.split(".", 2)[2] if name.startswith("blk.") else name for name in g.tensors]
        suffixes = [key[len(arch) + 1 :] for key in g.metadata if key.startswith(arch + ".")]
        features = missing_features(arch, roles, suffixes)
        missing = f"; not implemented: {arch}: {', '.join(features)}" if features else ""
        raise UnsupportedArchitectureError(
            f"{g.path}: unsupported architecture {arch!r} (supported: {', '.join(supported_architectures())})"
            f"{missing}"
        )
    return spec
