"""Tensor names and shapes of the synthetic writer (testing/synthetic/models.py) per architecture, as
llama.cpp's converters lay them out (LFM2's: testing/synthetic/lfm2.py)."""

from __future__ import annotations

from collections.abc import Callable

from edgellm.testing.synthetic.lfm2 import lfm2_shapes
from edgellm.testing.synthetic.qwen35 import qwen35_shapes

LAYER_NORM_ARCHS = ("starcoder2", "gpt2")  # LayerNorm with biases, biased ungated MLP (layer_norm_shapes)
POST_NORM_ARCHS = ("gemma2", "gemma3", "olmo2")  # post_attention_norm and post_ffw_norm
# Phi-3's converter keeps the checkpoint's fused attn_qkv and gate|up (ffn_up of 2 * n_ff rows, no ffn_gate)
FUSED_ARCHS = ("phi3",)


def tensor_shapes(
    arch: str,
    n_layers: int,
    n_embd: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    n_ff: int,
    n_vocab: int,
    tied: bool,
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy-order shape (rows, cols) as llama.cpp's loader expects them, in file order."""
    if arch in LAYER_NORM_ARCHS:
        return layer_norm_shapes(arch, n_layers, n_embd, n_kv_heads * head_dim, n_ff, n_vocab, tied)
    if arch == "lfm2":
        return lfm2_shapes(n_layers, n_embd, n_kv_heads, head_dim, n_ff, n_vocab, tied)
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        return qwen35_shapes(arch, n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff, n_vocab, tied)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, n_embd)}
    q_rows, kv_rows = n_heads * head_dim, n_kv_heads * head_dim
    for il in range(n_layers):
        p = f"blk.{il}."
        if arch != "olmo2":  # OLMo 2 norms after the blocks only
            shapes[p + "attn_norm.weight"] = (n_embd,)
        if arch in FUSED_ARCHS:
            shapes[p + "attn_qkv.weight"] = (q_rows + 2 * kv_rows, n_embd)
        else:
            shapes[p + "attn_q.weight"] = (q_rows, n_embd)
            shapes[p + "attn_k.weight"] = (kv_rows, n_embd)
            shapes[p + "attn_v.weight"] = (kv_rows, n_embd)
        if arch in ("qwen2", "qwen2moe", "gpt-oss", "seed_oss", "glm4moe"):
            shapes[p + "attn_q.bias"] = (q_rows,)
            shapes[p + "attn_k.bias"] = (kv_rows,)
            shapes[p + "attn_v.bias"] = (kv_rows,)
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            shapes[p + "attn_q_norm.weight"] = (head_dim,)
            shapes[p + "attn_k_norm.weight"] = (head_dim,)
        if arch in ("olmo2", "olmoe"):  # over the whole projection
            shapes[p + "attn_q_norm.weight"] = (q_rows,)
            shapes[p + "attn_k_norm.weight"] = (kv_rows,)
        shapes[p + "attn_output.weight"] = (n_embd, q_rows)
        if arch == "gpt-oss":  # the output bias (required there) and the attention sinks
            shapes[p + "attn_output.bias"] = (n_embd,)
            shapes[p + "attn_sinks.weight"] = (n_heads,)
        # gpt-oss, Seed-OSS: the FFN's pre-norm has this name
        if arch in POST_NORM_ARCHS or arch in ("gpt-oss", "seed_oss", "glm4moe"):
            shapes[p + "post_attention_norm.weight"] = (n_embd,)
        if arch not in ("olmo2", "gpt-oss", "seed_oss", "glm4moe"):
            shapes[p + "ffn_norm.weight"] = (n_embd,)
        if arch in FUSED_ARCHS:
            shapes[p + "ffn_up.weight"] = (2 * n_ff, n_embd)
        else:
            shapes[p + "ffn_gate.weight"] = (n_ff, n_embd)
            shapes[p + "ffn_up.weight"] = (n_ff, n_embd)
        shapes[p + "ffn_down.weight"] = (n_embd, n_ff)
        if arch in POST_NORM_ARCHS:
            shapes[p + "post_ffw_norm.weight"] = (n_embd,)
    shapes["output_norm.weight"] = (n_embd,)
    if not tied and arch != "gemma2":  # Gemma 2's output is always the embedding
        shapes["output.weight"] = (n_vocab, n_embd)
    return shapes


def layer_norm_shapes(
    arch: str, n_layers: int, n_embd: int, kv_rows: int, n_ff: int, n_vocab: int, tied: bool
) -> dict[str, tuple[int, ...]]:
    """StarCoder 2 / GPT-2 tensors as their converters write them: Q as wide as the model, every norm and
    matrix biased, no ffn_gate; GPT-2's fused attn_qkv (write_tiny_model adds its position_embd, one row
    per position of the context)."""
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, n_embd)}
    qkv = n_embd + 2 * kv_rows
    for il in range(n_layers):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = shapes[p + "attn_norm.bias"] = (n_embd,)
        if arch == "gpt2":
            shapes[p + "attn_qkv.weight"], shapes[p + "attn_qkv.bias"] = (qkv, n_embd), (qkv,)
        else:
            for n, rows in (("q", n_embd), ("k", kv_rows), ("v", kv_rows)):
                shapes[p + f"attn_{n}.weight"], shapes[p + f"attn_{n}.bias"] = (rows, n_embd), (rows,)
        shapes[p + "attn_output.weight"], shapes[p + "attn_output.bias"] = (n_embd, n_embd), (n_embd,)
        shapes[p + "ffn_norm.weight"] = shapes[p + "ffn_norm.bias"] = (n_embd,)
        shapes[p + "ffn_up.weight"], shapes[p + "ffn_up.bias"] = (n_ff, n_embd), (n_ff,)
        shapes[p + "ffn_down.weight"], shapes[p + "ffn_down.bias"] = (n_embd, n_ff), (n_embd,)
    shapes["output_norm.weight"] = shapes["output_norm.bias"] = (n_embd,)
    if not tied:
        shapes["output.weight"] = (n_vocab, n_embd)
    return shapes


def with_experts(
    shapes: dict[str, tuple[int, ...]],
    n_embd: int,
    n_expert: int,
    n_ff_exp: int,
    n_ff_shexp: int = 0,
    biases: bool = False,
) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's dense FFN replaced by a router and 3-D expert matrices (llama.cpp's
    ffn_gate_inp, ffn_{gate,up,down}_exps: numpy order [expert, rows, cols]), in the dense FFN's place,
    with n_ff_shexp a shared expert and its gate (Qwen 2 MoE's *_shexp), with `biases` the router's and
    each expert's (gpt-oss: ffn_gate_inp.bias [E], ffn_{gate,up}_exps.bias [E, n_ff_exp],
    ffn_down_exps.bias [E, n_embd])."""
    out: dict[str, tuple[int, ...]] = {}
    dense = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
    for name, shape in shapes.items():
        il, _, role = name.removeprefix("blk.").partition(".")
        if not name.startswith("blk.") or role not in dense:
            out[name] = shape
        elif role == "ffn_gate.weight":
            p = f"blk.{il}."
            out[p + "ffn_gate_inp.weight"] = (n_expert, n_embd)
            out[p + "ffn_gate_exps.weight"] = (n_expert, n_ff_exp, n_embd)
            out[p + "ffn_up_exps.weight"] = (n_expert, n_ff_exp, n_embd)
            out[p + "ffn_down_exps.weight"] = (n_expert, n_embd, n_ff_exp)
            if biases:
                out[p + "ffn_gate_inp.bias"] = (n_expert,)
                out[p + "ffn_gate_exps.bias"] = (n_expert, n_ff_exp)
                out[p + "ffn_up_exps.bias"] = (n_expert, n_ff_exp)
                out[p + "ffn_down_exps.bias"] = (n_expert, n_embd)
            if n_ff_shexp:
                out[p + "ffn_gate_inp_shexp.weight"] = (n_embd,)
                out[p + "ffn_gate_shexp.weight"] = (n_ff_shexp, n_embd)
                out[p + "ffn_up_shexp.weight"] = (n_ff_shexp, n_embd)
                out[p + "ffn_down_shexp.weight"] = (n_embd, n_ff_shexp)
    return out


def glm4moe_layers(
    shapes: dict[str, tuple[int, ...]],
    n_embd: int,
    n_ff: int,
    n_ff_shexp: int,
    n_expert: int,
    is_dense: Callable[[int], bool],
    selection_bias: bool = True,
) -> dict[str, tuple[int, ...]]:
    """with_experts' `shapes` made GLM-4.5's (convert_hf_to_gguf.py Glm4MoeModel; Llama 4's alike): the
    layers il with is_dense(il) keep a dense FFN n_ff wide in the experts' place (GLM: the leading ones;
    Llama 4: all but every step-th); the others add exp_probs_b.bias [E] after the router (selection_bias)
    and an ungated shared expert n_ff_shexp wide after the experts (0: none)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        il, _, role = name.removeprefix("blk.").partition(".")
        p = f"blk.{il}."
        dense = name.startswith("blk.") and is_dense(int(il))
        if dense and (role.endswith("_exps.weight") or role == "ffn_gate_inp.weight"):
            if role == "ffn_gate_inp.weight":
                out.update({p + "ffn_gate.weight": (n_ff, n_embd), p + "ffn_up.weight": (n_ff, n_embd),
                            p + "ffn_down.weight": (n_embd, n_ff)})  # fmt: skip
            continue
        out[name] = shape
        if role == "ffn_gate_inp.weight" and selection_bias:
            out[p + "exp_probs_b.bias"] = (n_expert,)
        if role == "ffn_down_exps.weight" and n_ff_shexp:
            out.update({p + "ffn_gate_shexp.weight": (n_ff_shexp, n_embd),
                        p + "ffn_up_shexp.weight": (n_ff_shexp, n_embd),
                        p + "ffn_down_shexp.weight": (n_embd, n_ff_shexp)})  # fmt: skip
    return out


def mla_layers(
    shapes: dict[str, tuple[int, ...]], n_embd: int, n_heads: int, head_dim: int, q_lora: int
) -> dict[str, tuple[int, ...]]:
    """`shapes` with each layer's attn_q/k/v made DeepSeek 2's multi-head latent attention (convert_hf_to_
    gguf.py DeepseekV2Model, the split attn_k_b / attn_v_b form), sizes from head_dim d as
    testing/synthetic/metadata.py writes them: latent r = 2d, rope d, nope 2d, value d (q-LoRA rank q_lora, 0:
    attn_q); every row 32-aligned at d = 16, so each matrix takes the block-32 types."""
    r, rope, nope, dv = 2 * head_dim, head_dim, 2 * head_dim, head_dim
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        il, _, role = name.removeprefix("blk.").partition(".")
        p = f"blk.{il}."
        if role in ("attn_k.weight", "attn_v.weight"):
            continue
        if role == "attn_q.weight":
            if q_lora:
                out.update({p + "attn_q_a.weight": (q_lora, n_embd), p + "attn_q_a_norm.weight": (q_lora,),
                            p + "attn_q_b.weight": (n_heads * (nope + rope), q_lora)})  # fmt: skip
            else:
                out[name] = (n_heads * (nope + rope), n_embd)
            out.update({p + "attn_kv_a_mqa.weight": (r + rope, n_embd), p + "attn_kv_a_norm.weight": (r,),
                        p + "attn_k_b.weight": (n_heads, r, nope),
                        p + "attn_v_b.weight": (n_heads, dv, r)})  # fmt: skip
            continue
        out[name] = (n_embd, n_heads * dv) if role == "attn_output.weight" else shape
    return out
