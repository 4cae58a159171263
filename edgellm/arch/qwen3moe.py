"""Qwen 3 MoE decoder (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3's attention, a mixture of experts as FFN.

    x = embed(tokens)                                  # [T, n_embd]
    for each layer:
        q, k = rmsnorm_heads(Wq h) * attn_q_norm, rmsnorm_heads(Wk h) * attn_k_norm   # per head [d]
        x += Wo @ attention(rope(q), rope(k), Wv h)    with h = rmsnorm(x) * attn_norm
        x += MoE(h)                                    with h = rmsnorm(x) * ffn_norm (arch/moe.py)
    logits = W_out @ (rmsnorm(x) * output_norm)

MoE: qwen3moe.expert_count experts of width qwen3moe.expert_feed_forward_length, expert_used_count of
them per token, softmax over all the router's logits, then the top k renormalised to sum to 1 (llama.cpp's
norm_w for this architecture). qwen3moe.feed_forward_length (the dense width) is not used.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import EXPERT_KEYS, MOE_BLOCK, QK_NORMS, ArchSpec, Experts

SPEC = ArchSpec(
    name="qwen3moe",
    block_tensors=MOE_BLOCK | QK_NORMS,
    keys=EXPERT_KEYS | {"expert_feed_forward_length"},
    flags={"qk_norm": True},
    # the width key defaults to feed_forward_length / expert_used_count, as llama.cpp
    experts=Experts(renormalise=True, width_key=False),
)


class Qwen3MoeModel(LlamaModel):
    """LlamaModel's loop: Q/K norms are a ModelConfig flag, the MoE FFN follows from cfg.n_expert."""


MODEL = Qwen3MoeModel
