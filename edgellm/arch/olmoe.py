"""OLMoE decoder (allenai OLMoE-1B-7B): pre-norms as llama, Q/K norms over the whole projection as OLMo 2,
a mixture of experts as FFN.

    x = embed(tokens)                                  # [T, n_embd]
    for each layer:
        q, k = rmsnorm(Wq h) * attn_q_norm, rmsnorm(Wk h) * attn_k_norm    # over [H*d] and [Hkv*d]
        x += Wo @ attention(rope(q), rope(k), Wv h)    with h = rmsnorm(x) * attn_norm
        x += MoE(h)                                    with h = rmsnorm(x) * ffn_norm (arch/moe.py)
    logits = W_out @ (rmsnorm(x) * output_norm)

MoE: olmoe.expert_count experts of width olmoe.feed_forward_length, expert_used_count per token, weighted
by their softmax probabilities over all experts, not renormalised (llama.cpp's norm_w false for OLMoE).
llama.cpp's loader sizes attn_k_norm as n_embd: it reads files without grouped-query attention only.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import EXPERT_KEYS, MOE_BLOCK, QK_NORMS, ArchSpec, Experts

SPEC = ArchSpec(
    name="olmoe",
    block_tensors=MOE_BLOCK | QK_NORMS,
    keys=EXPERT_KEYS,  # the experts are feed_forward_length wide: llama.cpp reads no expert width for OLMoE
    flags={"qk_norm_full": True},  # Q and K normed over the whole projection, after the usual pre-norm
    experts=Experts(renormalise=False),
)


class OlmoeModel(LlamaModel):
    """LlamaModel's loop: the Q/K norm placement is a ModelConfig flag, the MoE FFN follows from
    cfg.n_expert."""


MODEL = OlmoeModel
