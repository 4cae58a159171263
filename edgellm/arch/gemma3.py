"""Gemma 3 decoder (text).

    x = embed(tokens) * sqrt(n_embd)                   # [T, n_embd]
    for each layer (local: sliding window, rope base 10k; by default 5 local then 1 global layer, else as
    gemma3.attention.sliding_window_pattern says):
        a = Wo @ attention(rope(qnorm(Wq h)), rope(knorm(Wk h)), Wv h),  h = rmsnorm(x) * attn_norm
        x += rmsnorm(a) * post_attention_norm
        f = W_down @ (gelu(W_gate h) * (W_up h)),                          h = rmsnorm(x) * ffn_norm
        x += rmsnorm(f) * post_ffw_norm
    logits = tok_embd @ (rmsnorm(x) * output_norm)     # tied output weights

Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores 1 + w in the GGUF file, so the
norm here is the plain x * w. Q is scaled by 1/sqrt(head_dim) (cfg.attn_scale).
"""

from __future__ import annotations

import math

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import (
    LLAMA_BLOCK,
    POST_NORMS,
    QK_NORMS,
    QKV_BIASES,
    SLIDING_WINDOW_KEYS,
    ArchSpec,
    swa_pattern,
)
from edgellm.gguf.metadata import get_float
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFFile


def read_gemma3(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_gemma3 reads it: embeddings times sqrt(n_embd); with a window, five local
    layers then a global one (pattern 6); the logits soft-capped when the file says so."""
    p = "gemma3."
    cfg.embd_scale = math.sqrt(cfg.n_embd)
    if cfg.sliding_window > 0:  # else every layer is global, as in llama.cpp
        cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 6)
    cfg.final_logit_softcap = get_float(g, p + "final_logit_softcapping", 0.0, lo=0.0)
    # Gemma 3 27B scales by the model width per head; the others by the head size (llama.cpp).
    if cfg.n_layers == 62:
        cfg.attn_scale = 1.0 / math.sqrt(cfg.n_embd / cfg.n_heads)


SPEC = ArchSpec(
    name="gemma3",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | QK_NORMS | POST_NORMS,
    keys=SLIDING_WINDOW_KEYS | {"final_logit_softcapping", "rope.freq_base_swa"},
    fused_qkv=True,
    sliding_window=True,  # 0 when missing: every layer global
    swa_rope=(10000.0, False),  # the local layers: rope.freq_base_swa (default 10000), never scaled
    flags={"qk_norm": True, "post_norms": True, "activation": "gelu"},
    read=read_gemma3,
)


class Gemma3Model(LlamaModel):
    """Same weights layout and forward loop as LlamaModel: every Gemma difference (embedding scale, Q/K
    norms, post norms, GeGLU, per-layer window and rope base) is a ModelConfig flag the shared blocks read."""


MODEL = Gemma3Model
