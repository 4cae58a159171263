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

from edgellm.arch.llama import LlamaModel


class Gemma2Model(LlamaModel):
    """LlamaModel's weights and loop: every Gemma 2 difference (embedding scale, post norms, GeGLU,
    alternating windows, the two soft-caps) is a ModelConfig flag that the shared blocks and the
    attention kernels read."""
