"""IBM Granite 3.x dense decoder: llama with four multipliers from the file's metadata.

    x = embed(tokens) * embedding_scale                 # [T, n_embd]
    for each layer:
        x += residual_scale * (Wo @ attention(rope(Wq h), rope(Wk h), Wv h))   h = rmsnorm(x) * attn_norm,
                                                        # Q.K times attention.scale before the softmax
        x += residual_scale * (W_down @ (silu(W_gate h) * (W_up h)))          h = rmsnorm(x) * ffn_norm
    logits = (W_out @ (rmsnorm(x) * output_norm)) / logit_scale

The multipliers are granite.embedding_scale, residual_scale, attention.scale (each 0 or absent: off, i.e.
1, 1 and 1/sqrt(head_dim)) and logit_scale (required), read by read_granite below. Rope is llama's (adjacent
pairs); the optional biases are llama's.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import LLAMA_BIASES, LLAMA_BLOCK, QKV_BIASES, ArchSpec
from edgellm.gguf.metadata import get_float
from edgellm.gguf.model_config import ROPE_NORM, ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile


def read_granite(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_granite reads it: four multipliers, each off at 0 (llama.cpp's default)
    except logit_scale, which the file must have."""
    p = "granite."
    cfg.logit_scale = get_float(g, p + "logit_scale", lo=0.0, lo_open=True)
    cfg.embd_scale = get_float(g, p + "embedding_scale", 0.0, lo=0.0) or 1.0
    cfg.residual_scale = get_float(g, p + "residual_scale", 0.0, lo=0.0) or 1.0
    cfg.attn_scale = get_float(g, p + "attention.scale", 0.0, lo=0.0) or cfg.attn_scale
    # llama.cpp's Granite turns rope off where rope.scaling.finetuned is false (Granite 4's NoPE layers)
    if not bool(g.get("granite.rope.scaling.finetuned", True)):
        raise GGUFError(
            f"{g.path}: metadata granite.rope.scaling.finetuned = {g.get('granite.rope.scaling.finetuned')} "
            "(no rotary embedding, llama.cpp's NoPE switch for Granite) is not implemented"
        )


SPEC = ArchSpec(
    name="granite",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | LLAMA_BIASES,  # llama_model_granite's optional biases
    keys=frozenset({"embedding_scale", "residual_scale", "attention.scale", "logit_scale"}),
    fused_qkv=True,
    rope_type=ROPE_NORM,
    read=read_granite,
)


class GraniteModel(LlamaModel):
    """LlamaModel's weights and loop: the multipliers are ModelConfig fields the shared blocks read."""


MODEL = GraniteModel
