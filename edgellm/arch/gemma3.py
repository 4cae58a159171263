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

from edgellm.arch.llama import LlamaModel


class Gemma3Model(LlamaModel):
    """Same weights layout and forward loop as LlamaModel: every Gemma difference (embedding scale, Q/K
    norms, post norms, GeGLU, per-layer window and rope base) is a ModelConfig flag the shared blocks read."""
