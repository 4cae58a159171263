"""BERT encoder (bge, MiniLM, e5, mxbai-embed, snowflake-arctic-embed; bge-reranker / ms-marco cross-encoders
with their classification head), as llama.cpp's llama_model_bert: learned absolute positions, GELU MLP,
post-norm layers. The pass and the head: arch/encoder.py.

Tensors (numpy order): token_embd [V, e], position_embd [n_ctx_train, e], token_types [n_types, e]
(optional), token_embd_norm (weight, bias) [e]; per layer attn_q/k/v [e, e] (+ bias) or attn_qkv [3e, e],
attn_output [e, e] (+ bias), attn_output_norm [e] x2, ffn_up [f, e] (+ bias), ffn_down [e, f] (+ bias),
layer_output_norm [e] x2; head: cls [e, e] + bias, cls.output [n_cls_out, e] + bias (all optional).
"""

from __future__ import annotations

from edgellm.arch.encoder import ENCODER_GLOBALS, ENCODER_KEYS, ENCODER_NORMS, EncoderModel, read_encoder
from edgellm.arch.spec import ArchSpec, Shapes
from edgellm.gguf.model_config import ROPE_NONE, ModelConfig

QKV = frozenset(f"attn_{n}.{p}" for n in "qkv" for p in ("weight", "bias"))
BERT_BLOCK = (
    QKV
    | ENCODER_NORMS
    | frozenset(f"{m}.{p}" for m in ("attn_output", "ffn_up", "ffn_down") for p in ("weight", "bias"))
)


def encoder_shapes(cfg: ModelConfig, gated: bool = False, positions: bool = True) -> Shapes:
    """Every tensor EncoderModel reads as required -> its shape (the optional biases, token types and head:
    validation.optional_tensors and EncoderModel's own shape checks)."""
    e, f = cfg.n_embd, cfg.n_ff
    shapes: Shapes = {"token_embd.weight": (cfg.n_vocab, e), "token_embd_norm.weight": (e,),
                      "token_embd_norm.bias": (e,)}  # fmt: skip
    if positions:
        shapes["position_embd.weight"] = (cfg.n_ctx_train, e)
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        layer = {"attn_output.weight": (e, e), "ffn_up.weight": (f, e), "ffn_down.weight": (e, f)}
        if cfg.qkv_fused[il]:
            layer["attn_qkv.weight"] = (3 * e, e)
        else:
            layer.update({f"attn_{n}.weight": (e, e) for n in "qkv"})
        if gated:
            layer["ffn_gate.weight"] = (f, e)
        for norm in ("attn_output_norm", "layer_output_norm"):
            layer.update({f"{norm}.weight": (e,), f"{norm}.bias": (e,)})
        shapes.update({p + name: shape for name, shape in layer.items()})
    return shapes


SPEC = ArchSpec(
    name="bert",
    block_tensors=BERT_BLOCK,
    keys=ENCODER_KEYS,
    global_tensors=ENCODER_GLOBALS | {"position_embd.weight"},
    fused_qkv=True,
    rope_type=ROPE_NONE,  # learned absolute positions
    read=read_encoder,
    tensor_shapes=encoder_shapes,
)

MODEL = EncoderModel
