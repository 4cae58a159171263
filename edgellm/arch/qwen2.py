"""Qwen 2 / Qwen 2.5 decoder: llama with Q/K/V biases, rope rotating halves (NEOX).

    x = embed(tokens)                                  # [T, n_embd]
    for each layer:
        x += Wo @ attention(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv)    with h = rmsnorm(x) * attn_norm
        x += W_down @ (silu(W_gate h) * (W_up h))                           with h = rmsnorm(x) * ffn_norm
    logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output

The biases are required (the converter always writes them; validation.check_qkv_forms names a missing one).
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import LLAMA_BLOCK, QKV_BIASES, ArchSpec

SPEC = ArchSpec(
    name="qwen2",
    block_tensors=LLAMA_BLOCK | QKV_BIASES,
    fused_qkv=True,
    flags={"qkv_bias": True},
)
MODEL = LlamaModel  # the biases are AttentionWeights.bqkv, which the shared attention block adds
