"""Qwen 2 MoE decoder (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen 2's attention (Q/K/V biases), a mixture of
experts plus a shared expert as FFN.

    x = embed(tokens)                                  # [T, n_embd]
    for each layer:
        x += Wo @ attention(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv)    with h = rmsnorm(x) * attn_norm
        x += MoE(h) + sigmoid(w_shexp . h) * FFN_shexp(h)                   with h = rmsnorm(x) * ffn_norm

MoE (arch/moe.py): qwen2moe.expert_count experts of width qwen2moe.expert_feed_forward_length,
expert_used_count per token, weighted by their softmax probabilities, not renormalised (llama.cpp's
norm_w false for Qwen 2 MoE); the shared expert qwen2moe.expert_shared_feed_forward_length wide, its gate
a vector (ffn_gate_inp_shexp) the block multiplies as one more row of the router.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import EXPERT_KEYS, MOE_BLOCK, ArchSpec, Experts

# The shared expert and its sigmoid gate
SHARED_EXPERT = frozenset(
    {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"}
)
SPEC = ArchSpec(
    name="qwen2moe",
    block_tensors=MOE_BLOCK | SHARED_EXPERT,
    keys=EXPERT_KEYS | {"expert_feed_forward_length", "expert_shared_feed_forward_length"},
    flags={"qkv_bias": True},
    experts=Experts(renormalise=False, width_key=False, shared=True),
)


class Qwen2MoeModel(LlamaModel):
    """LlamaModel's loop: Q/K/V biases are a ModelConfig flag, the MoE FFN and its shared expert follow
    from cfg.n_expert and cfg.n_ff_shexp."""


MODEL = Qwen2MoeModel
