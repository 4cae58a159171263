"""OLMo 2 decoder (and OLMo 3: the same file format with sliding-window layers).

    x = embed(tokens)                                  # [T, n_embd]
    for each layer (with olmo2.attention.sliding_window > 0: layers il % 4 < 3 local):
        q = rmsnorm(Wq x) * attn_q_norm                # [T, H*d]: one norm over the whole projection
        k = rmsnorm(Wk x) * attn_k_norm                # [T, Hkv*d]
        x += rmsnorm(Wo @ attention(rope(q), rope(k), Wv x)) * post_attention_norm
        x += rmsnorm(W_down @ (silu(W_gate x) * (W_up x))) * post_ffw_norm
    logits = W_out @ (rmsnorm(x) * output_norm)

No norm before attention or the FFN (cfg.pre_norms False): the blocks read the residual stream itself.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel


class Olmo2Model(LlamaModel):
    """LlamaModel's weights and loop: the norm placement is ModelConfig flags the shared blocks read."""
