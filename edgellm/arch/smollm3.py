"""SmolLM3 decoder (SmolLM3-3B): llama with no rotary embedding in every fourth layer.

    x = embed(tokens)                                  # [T, n_embd]
    for each layer il:
        r = rope if (il + 1) % 4 else identity         # layers 3, 7, 11, ...: no position embedding (NoPE)
        x += Wo @ attention(r(Wq h), r(Wk h), Wv h)    with h = rmsnorm(x) * attn_norm
        x += W_down @ (silu(W_gate h) * (W_up h))      with h = rmsnorm(x) * ffn_norm
    logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output

The step 4 is llama.cpp's n_no_rope_layer_step for SmolLM3, a constant (no key sets it). Rope rotates
adjacent pairs (the llama converter's permuted Q/K). Q|K|V biases are optional as for every architecture;
llama.cpp creates no other bias for SmolLM3, so a file with one is refused (SPEC.block_tensors).
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import LLAMA_BLOCK, QKV_BIASES, ArchSpec
from edgellm.gguf.model_config import ROPE_NORM

SPEC = ArchSpec(
    name="smollm3",
    block_tensors=LLAMA_BLOCK | QKV_BIASES,  # the graph reads output / FFN biases, the loader creates none
    fused_qkv=True,
    rope_type=ROPE_NORM,
    no_rope_layer_step=4,  # a constant in llama.cpp: no key sets it
)


class SmolLM3Model(LlamaModel):
    """LlamaModel's weights and loop: the NoPE layers are cfg.no_rope_layers (cfg.rope_of_layer gives
    None there and the attention block skips the rotation)."""


MODEL = SmolLM3Model
