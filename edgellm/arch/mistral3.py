"""Mistral 3 decoder (Ministral 3 3B / 8B / 14B; llama.cpp's LLM_ARCH_MISTRAL3, src/models/mistral3.cpp):
llama with YaRN read from the file (beta_fast, beta_slow, log multiplier) and Llama 4's attention
temperature tuning.

x = embed(tokens)                                  # [T, n_embd]
for each layer:
    q, k = rope(Wq h + bq), rope(Wk h + bk)        # [T, H, d], [T, Hkv, d]; rope rotating adjacent pairs
    q *= 1 + beta * ln(floor(pos / n_orig) + 1)    # per token: mistral3.attention.temperature_scale = beta,
                                                   # n_orig = rope.scaling.original_context_length
    x += Wo @ attention(q, k, Wv h + bv) + bo      with h = rmsnorm(x) * attn_norm
    x += FFN(rmsnorm(x) * ffn_norm)                # dense SwiGLU (optional biases), or experts (Mixtral's)
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output

Tensors as llama's (arch/spec.py llama_family_shapes): attn_{q,k,v}.weight [H*d | Hkv*d, n_embd] and
optional biases, attn_output.weight [n_embd, H*d] (+ optional bias [n_embd]), ffn_{gate,up}.weight
[n_ff, n_embd], ffn_down.weight [n_embd, n_ff] (+ optional biases), rope_freqs.weight [n_rot / 2]
(optional). The temperature is applied on the host (arch/common.py temperature_scaled), so the backend's
one-call layers are not used when the file sets it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import (
    EXPERT_KEYS,
    EXPERT_TENSORS,
    LLAMA_BIASES,
    LLAMA_BLOCK,
    QKV_BIASES,
    ArchSpec,
    Experts,
)
from edgellm.gguf.metadata import get_float
from edgellm.gguf.model_config import ROPE_NORM, ModelConfig
from edgellm.gguf.reader import GGUFFile
from edgellm.gguf.rope import YARN_READ_KEYS

if TYPE_CHECKING:
    from edgellm.backends.base import Backend


def read_mistral3(g: GGUFFile, cfg: ModelConfig) -> None:
    """mistral3.attention.temperature_scale (optional, 0: off), floored by the YaRN original context as
    llama.cpp's llama_model_mistral3 sets n_attn_temp_floor_scale (offset 0)."""
    cfg.attn_temp_scale = get_float(g, "mistral3.attention.temperature_scale", 0.0)
    cfg.attn_temp_floor = cfg.rope.n_ctx_orig  # >= 2: the training context when the key is 0 or missing
    cfg.attn_temp_offset = 0.0


SPEC = ArchSpec(
    name="mistral3",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | LLAMA_BIASES | EXPERT_TENSORS,
    keys=EXPERT_KEYS | {"attention.temperature_scale"},
    fused_qkv=True,
    rope_type=ROPE_NORM,
    rope_freq_factors=True,
    yarn_keys=YARN_READ_KEYS,  # beta_fast, beta_slow, log_multiplier
    experts=Experts(renormalise=True, optional=True),  # build_moe_ffn's norm_w: true
    read=read_mistral3,
)


class Mistral3Model(LlamaModel):
    """LlamaModel's weights and loop; the attention block applies the temperature (cfg.attn_temp_scale)."""

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        super().__init__(cfg, gguf, be, progress)
        if cfg.attn_temp_scale:  # a backend's one-call layer has no per-token Q scale
            self.fused = [None] * cfg.n_layers


MODEL = Mistral3Model
