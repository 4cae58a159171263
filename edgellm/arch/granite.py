"""IBM Granite 3.x dense decoder: llama with four multipliers from the file's metadata.

    x = embed(tokens) * embedding_scale                 # [T, n_embd]
    for each layer:
        x += residual_scale * (Wo @ attention(rope(Wq h), rope(Wk h), Wv h))   h = rmsnorm(x) * attn_norm,
                                                        # Q.K times attention.scale before the softmax
        x += residual_scale * (W_down @ (silu(W_gate h) * (W_up h)))          h = rmsnorm(x) * ffn_norm
    logits = (W_out @ (rmsnorm(x) * output_norm)) / logit_scale

The multipliers are granite.embedding_scale, residual_scale, attention.scale (each 0 or absent: off, i.e.
1, 1 and 1/sqrt(head_dim)) and logit_scale (required), read in gguf/config.py. Rope is llama's (adjacent
pairs); the optional biases are llama's.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel


class GraniteModel(LlamaModel):
    """LlamaModel's weights and loop: the multipliers are ModelConfig fields the shared blocks read."""
