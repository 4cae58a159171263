"""Gemma 2 decoder (2B, 9B, 27B).

    x = embed(tokens) * sqrt(n_embd)                   # [T, n_embd]
    for each layer (even layers: sliding window, 4096 by default; odd layers global):
        s = softcap_50(Q.K) with Q = rope(Wq h) * attn_scale,  K = rope(Wk h),  h = rmsnorm(x) * attn_norm
        x += rmsnorm(Wo @ (softmax(s) V)) * post_attention_norm
        f = W_down @ (gelu(W_gate h) * (W_up h)),               h = rmsnorm(x) * ffn_norm
        x += rmsnorm(f) * post_ffw_norm
    logits = softcap_30(tok_embd @ (rmsnorm(x) * output_norm))   # tied: llama.cpp reads no output.weight

softcap_c(s) = c * tanh(s / c), caps from gemma2.attn_logit_softcapping / final_logit_softcapping.
attn_scale: 1/sqrt(head_dim), or 1/sqrt(n_embd // n_heads) for the 46-layer 27B (llama.cpp's rule).
As in Gemma 3 the files store the norms' 1 + w, so every norm is the plain x * w.
"""

from __future__ import annotations

import math

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import (
    GLOBAL_TENSORS,
    LLAMA_BLOCK,
    POST_NORMS,
    QKV_BIASES,
    SLIDING_WINDOW_KEYS,
    ArchSpec,
    swa_pattern,
)
from edgellm.gguf.metadata import get_float
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile


def read_gemma2(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_gemma2 reads it: every layer soft-caps its attention logits (default cap
    50) and the logits (default 30); even layers use the window (pattern 2), at rope.freq_base_swa (default:
    rope.freq_base)."""
    p = "gemma2."
    cfg.embd_scale = math.sqrt(cfg.n_embd)
    if cfg.sliding_window == 0:
        raise GGUFError(f"{g.path}: metadata {p}attention.sliding_window = 0: Gemma 2 always has a window")
    cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 2)
    cfg.attn_softcap = get_float(g, p + "attn_logit_softcapping", 50.0, lo=0.0, lo_open=True)
    cfg.final_logit_softcap = get_float(g, p + "final_logit_softcapping", 30.0, lo=0.0, lo_open=True)
    # Gemma 2 27B (46 layers) scales Q by the model width per head (an integer division), the others by
    # the head size.
    if cfg.n_layers == 46:
        cfg.attn_scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_heads)


SPEC = ArchSpec(
    name="gemma2",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | POST_NORMS,
    keys=SLIDING_WINDOW_KEYS | {"attn_logit_softcapping", "final_logit_softcapping", "rope.freq_base_swa"},
    # llama.cpp's Gemma 2 always projects with token_embd.weight: an output.weight would go unused there
    global_tensors=GLOBAL_TENSORS - {"output.weight"},
    fused_qkv=True,
    sliding_window=True,
    sliding_window_default=4096,
    swa_rope=(None, True),  # the local layers: rope.freq_base_swa (default rope.freq_base), scaled
    flags={"post_norms": True, "activation": "gelu"},
    read=read_gemma2,
)


class Gemma2Model(LlamaModel):
    """LlamaModel's weights and loop: every Gemma 2 difference (embedding scale, post norms, GeGLU,
    alternating windows, the two soft-caps) is a ModelConfig flag that the shared blocks and the
    attention kernels read."""


MODEL = Gemma2Model
