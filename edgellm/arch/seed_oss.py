"""Seed-OSS decoder (ByteDance Seed-OSS-36B; llama.cpp's LLM_ARCH_SEED_OSS, src/models/seed-oss.cpp): llama
with Q/K/V biases, rope rotating halves (NEOX), and the FFN's pre-norm stored as post_attention_norm.

x = embed(tokens)                                  # [T, n_embd]
for each layer:
    x += Wo @ attention(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv)   with h = rmsnorm(x) * attn_norm
    x += W_down @ (silu(W_gate h) * (W_up h))      with h = rmsnorm(x) * post_attention_norm
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output

Tensors: attn_norm.weight [n_embd], attn_{q,k,v}.weight [H*d | Hkv*d, n_embd] (+ optional biases, as
create_tensor_qkv reads them; the released files have them), attn_output.weight [n_embd, H*d] (no bias),
post_attention_norm.weight [n_embd], ffn_{gate,up}.weight [n_ff, n_embd], ffn_down.weight [n_embd, n_ff].
"""

from __future__ import annotations

from functools import partial
from typing import Any

from edgellm.arch.common import TensorSource, load_attention, load_feed_forward
from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import LLAMA_BLOCK, QKV_BIASES, ArchSpec, Shapes, llama_family_shapes
from edgellm.gguf.model_config import ModelConfig

FFN_NORM = "post_attention_norm.weight"  # llama.cpp's attn_post_norm: the FFN's pre-norm


def seed_oss_layer(cfg: ModelConfig, layer: Shapes) -> Shapes:
    """A llama layer's tensors with the FFN's pre-norm under Seed-OSS's name."""
    out = {name: shape for name, shape in layer.items() if name != "ffn_norm.weight"}
    out[FFN_NORM] = (cfg.n_embd,)
    return out


SPEC = ArchSpec(
    name="seed_oss",
    block_tensors=(LLAMA_BLOCK - {"ffn_norm.weight"}) | QKV_BIASES | {FFN_NORM},
    fused_qkv=True,
    tensor_shapes=partial(llama_family_shapes, adjust_layer=seed_oss_layer),
)


class SeedOssModel(LlamaModel):
    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        return load_attention(be, src, cfg, il), load_feed_forward(be, src, cfg, il, norm=FFN_NORM)


MODEL = SeedOssModel
