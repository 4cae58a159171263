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

from functools import partial

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import (
    LLAMA_BLOCK,
    POST_NORMS,
    QK_NORMS,
    QKV_BIASES,
    SLIDING_WINDOW_KEYS,
    ArchSpec,
    llama_family_shapes,
    swa_pattern,
)
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFFile


def read_olmo2(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_olmo2 reads it: with olmo2.attention.sliding_window > 0 (OLMo 3), layers
    il % 4 < 3 are local (pattern 4). llama.cpp reads rope.freq_base_swa but its OLMo 2 graph rotates local
    layers at the global rope.freq_base, so here too (no swa_rope)."""
    if cfg.sliding_window > 0:
        cfg.swa_layers = swa_pattern(g, "olmo2.attention.sliding_window_pattern", cfg.n_layers, 4)


SPEC = ArchSpec(
    name="olmo2",
    # no attn_norm / ffn_norm: OLMo 2 norms after each block (Q/K norms over the whole projection)
    block_tensors=(LLAMA_BLOCK - {"attn_norm.weight", "ffn_norm.weight"})
    | QKV_BIASES
    | QK_NORMS
    | POST_NORMS,
    keys=SLIDING_WINDOW_KEYS | {"rope.freq_base_swa"},
    fused_qkv=True,
    sliding_window=True,  # 0 when missing: every layer global (OLMo 2; OLMo 3 has a window)
    flags={"pre_norms": False, "post_norms": True, "qk_norm_full": True},
    read=read_olmo2,
    tensor_shapes=partial(llama_family_shapes, output_required=True),  # llama.cpp requires output.weight
)


class Olmo2Model(LlamaModel):
    """LlamaModel's weights and loop: the norm placement is ModelConfig flags the shared blocks read."""


MODEL = Olmo2Model
