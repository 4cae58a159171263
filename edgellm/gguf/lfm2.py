"""LFM2's metadata and tensors as llama.cpp's llama_model_lfm2 reads them (the model: arch/lfm2.py).

LFM2 mixes two kinds of layer. `lfm2.attention.head_count_kv` is a per-layer array: 0 marks a short-conv
layer (a gated causal depthwise convolution over the last `lfm2.shortconv.l_cache` tokens), a positive
count an attention layer (Q/K norms, NEOX rope). Every attention layer has the same count here, since
every layer shares one KV cache shape. The final norm is stored as `token_embd_norm.weight` (llama.cpp's
LLM_TENSOR_OUTPUT_NORM_LFM2: the converter's name for it), not applied after the embedding.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf.metadata import INT32_MAX, check_int_range, describe, get_int, is_int
from edgellm.gguf.reader import GGUFError, GGUFFile

OUTPUT_NORM = "token_embd_norm.weight"
CONV_TENSOR = "shortconv.conv.weight"
# Only the conv kernel's F32 is read by llama.cpp's ssm_conv (its converter and quantizer keep it F32)
CONV_TYPES = (GGMLQuantizationType.F32,)


def lfm2_head_counts(g: GGUFFile, n_heads: int, n_layers: int) -> tuple[int, list[bool]]:
    """(KV heads of the attention layers, per-layer flags: True for a short-conv layer) from
    lfm2.attention.head_count_kv: an array of one count per layer, or a scalar (every layer attention)."""
    key = "lfm2.attention.head_count_kv"
    value = g.get(key, n_heads)
    if is_int(value):
        counts = [int(value)] * n_layers
    elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        if len(value) != n_layers:
            raise GGUFError(f"{g.path}: metadata {key} has {len(value)} entries for {n_layers} layers")
        counts = [int(v) for v in value]
    else:
        raise GGUFError(
            f"{g.path}: metadata {key} must be an integer or an array of them, got {describe(value)}"
        )
    attention = sorted({c for c in counts if c != 0})
    if len(attention) > 1:
        raise GGUFError(
            f"{g.path}: metadata {key} = {counts[:16]}: attention layers with different KV head counts "
            f"{attention} are not implemented (every layer shares one KV cache shape)"
        )
    n_kv = attention[0] if attention else n_heads
    check_int_range(g, key, n_kv, 1, n_heads, f"lfm2.attention.head_count = {n_heads}")
    return n_kv, [c == 0 for c in counts]


def read_lfm2(g: GGUFFile, cfg) -> None:  # noqa: ANN001 - config.ModelConfig (imports this module)
    """The short-conv width and Q/K norms; the layer kinds were set from head_count_kv."""
    cfg.qk_norm = True
    # llama.cpp requires the key; the state keeps l_cache - 1 past rows per conv layer
    cfg.conv_l_cache = get_int(g, "lfm2.shortconv.l_cache", lo=2, hi=min(INT32_MAX, g.file_size))
    if cfg.head_dim_v != cfg.head_dim or cfg.n_heads * cfg.head_dim != cfg.n_embd:
        raise GGUFError(
            f"{g.path}: lfm2 heads of {cfg.head_dim} (K) / {cfg.head_dim_v} (V) x {cfg.n_heads} must span "
            f"lfm2.embedding_length = {cfg.n_embd} (llama.cpp's LFM2 shapes)"
        )


def lfm2_tensors(cfg) -> dict[str, tuple[int, ...]]:  # noqa: ANN001 - config.ModelConfig
    """Every tensor arch/lfm2.py reads -> its numpy-order shape (output.weight: optional, tied)."""
    e, f, V, L = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.conv_l_cache
    kv, d = cfg.n_kv_heads * cfg.head_dim, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, e)}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        if cfg.conv_layers[il]:
            layer = {"attn_norm.weight": (e,), "shortconv.in_proj.weight": (3 * e, e),
                     CONV_TENSOR: (e, L), "shortconv.out_proj.weight": (e, e)}  # fmt: skip
        else:
            layer = {"attn_norm.weight": (e,), "attn_q.weight": (e, e), "attn_k.weight": (kv, e),
                     "attn_v.weight": (kv, e), "attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,),
                     "attn_output.weight": (e, e)}  # fmt: skip
        layer |= {"ffn_norm.weight": (e,), "ffn_gate.weight": (f, e), "ffn_up.weight": (f, e),
                  "ffn_down.weight": (e, f)}  # fmt: skip
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes[OUTPUT_NORM] = (e,)
    return shapes


def check_lfm2_layers(g: GGUFFile, cfg) -> None:  # noqa: ANN001 - config.ModelConfig
    """A layer carries only its own kind's tensors (the allowlist is per architecture, not per layer), and
    the conv kernels are F32 (the only type llama.cpp's ssm_conv reads)."""
    expected = lfm2_tensors(cfg)
    for name, t in g.tensors.items():
        if name.startswith("blk.") and name not in expected:
            kind = "short-conv" if cfg.conv_layers[int(name.split(".")[1])] else "attention"
            raise GGUFError(
                f"{g.path}: tensor {name!r} is not one a {kind} layer of lfm2 has (the layer kinds come from "
                "lfm2.attention.head_count_kv: 0 for a short-conv layer)"
            )
        if name.endswith(CONV_TENSOR) and t.qtype not in CONV_TYPES:
            raise GGUFError(
                f"{g.path}: tensor {name!r} is {GGMLQuantizationType(t.qtype).name}: lfm2's conv kernel is "
                "read as F32 only (as llama.cpp's ssm_conv)"
            )
