"""Qwen 3 decoder (dense: 0.6B .. 32B): llama with per-head RMSNorms of Q and K, rope rotating halves (NEOX).

x = embed(tokens)                                  # [T, n_embd]
for each layer:
    q, k = rmsnorm_heads(Wq h) * attn_q_norm, rmsnorm_heads(Wk h) * attn_k_norm   # per head [d]
    x += Wo @ attention(rope(q), rope(k), Wv h)    with h = rmsnorm(x) * attn_norm
    x += W_down @ (silu(W_gate h) * (W_up h))      with h = rmsnorm(x) * ffn_norm
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import LLAMA_BLOCK, QK_NORMS, QKV_BIASES, ArchSpec

SPEC = ArchSpec(
    name="qwen3",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | QK_NORMS,
    fused_qkv=True,
    flags={"qk_norm": True},
)
MODEL = LlamaModel  # the Q/K norms are AttentionWeights.q_norm / k_norm, which the attention block applies
