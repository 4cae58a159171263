"""gpt-oss decoder (gpt-oss-20b, gpt-oss-120b; llama.cpp's LLM_ARCH_OPENAI_MOE, llama_model_openai_moe).

    x = embed(tokens)                                  # [T, n_embd]
    for each layer (even layers: a sliding window of gpt-oss.attention.sliding_window, 128; odd: global):
        h = rmsnorm(x) * attn_norm
        q, k, v = Wq h + bq, Wk h + bk, Wv h + bv       # [T, H, d], [T, Hkv, d], [T, Hkv, d]
        s = rope(q) . rope(k) / sqrt(n_rot)            # NEOX rope, YaRN from the metadata
        p = exp(s) / (sum exp(s) + exp(attn_sinks[h]))  # the sink: one more logit per head, no value
        x += Wo @ (p V) + bo
        h = rmsnorm(x) * post_attention_norm           # the FFN's pre-norm, whatever its name
        x += MoE(h)                                    # arch/moe.py, as below
    logits = W_out @ (rmsnorm(x) * output_norm)        # output.weight required (never tied)

MoE: expert_count experts of width expert_feed_forward_length, expert_used_count per token.
    z = W_router h + b_router                          # [T, n_expert]
    sel = top-k(z), w = softmax(z[sel])                # [T, k]: the softmax over the k chosen logits only
    expert e: W_down[e] @ swiglu_oai(W_gate[e] h + b_gate[e], W_up[e] h + b_up[e]) + b_down[e]
    swiglu_oai(g, u) = min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1)

Tensors (numpy order) beyond llama's attention: attn_q/k/v.bias (optional), attn_output.bias [n_embd],
attn_sinks.weight [H], ffn_gate_inp.bias [E], ffn_{gate,up}_exps.bias [E, n_ff_exp], ffn_down_exps.bias
[E, n_embd]; the expert matrices [E, n_ff_exp, n_embd] x2 and [E, n_embd, n_ff_exp] (MXFP4 in the released
files). The CPU and CUDA backends run it; a backend without attention sinks refuses it at load.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

from edgellm.arch.common import TensorSource, load_attention
from edgellm.arch.llama import LlamaModel
from edgellm.arch.moe import load_moe_feed_forward
from edgellm.arch.spec import (
    EXPERT_KEYS,
    MOE_BLOCK,
    SLIDING_WINDOW_KEYS,
    ArchSpec,
    Experts,
    Shapes,
    llama_family_shapes,
    swa_pattern,
)
from edgellm.gguf.model_config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend


def read_gpt_oss(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_openai_moe reads it: even layers local with the required
    gpt-oss.attention.sliding_window (pattern 2, as Gemma 2), at rope.freq_base_swa (default rope.freq_base)
    and the global layers' frequency scaling; Q.K scaled by 1/sqrt(rope.dimension_count)."""
    cfg.attn_scale = 1.0 / math.sqrt(cfg.rope_dim)
    if cfg.sliding_window == 0:  # llama.cpp's standard window of 0 would mask every key
        raise GGUFError(
            f"{g.path}: metadata gpt-oss.attention.sliding_window = 0: gpt-oss always has a window"
        )
    cfg.swa_layers = swa_pattern(g, "gpt-oss.attention.sliding_window_pattern", cfg.n_layers, 2)


def gpt_oss_layer(cfg: ModelConfig, layer: Shapes) -> Shapes:
    """A llama layer's tensors made gpt-oss's: post_attention_norm is the experts' pre-norm, the attention
    sinks, and the biases llama.cpp requires (output projection, router, every expert matrix)."""
    e, E, fe = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    out = {name: shape for name, shape in layer.items() if name != "ffn_norm.weight"}
    out.update(
        {
            "post_attention_norm.weight": (e,),
            "attn_sinks.weight": (cfg.n_heads,),
            "attn_output.bias": (e,),
            "ffn_gate_inp.bias": (E,),
            "ffn_gate_exps.bias": (E, fe),
            "ffn_up_exps.bias": (E, fe),
            "ffn_down_exps.bias": (E, e),
        }
    )
    return out


SPEC = ArchSpec(
    name="gpt-oss",
    # biased attention with sinks, post_attention_norm as the FFN's pre-norm, a biased router and biased
    # experts; every bias but Q/K/V's required (gpt_oss_layer)
    block_tensors=(MOE_BLOCK - {"ffn_norm.weight"})
    | {"attn_output.bias", "attn_sinks.weight", "post_attention_norm.weight", "ffn_gate_inp.bias"}
    | {f"ffn_{m}_exps.bias" for m in ("gate", "up", "down")},
    keys=EXPERT_KEYS | SLIDING_WINDOW_KEYS | {"expert_feed_forward_length", "rope.freq_base_swa"},
    fused_qkv=True,
    sliding_window=True,
    sliding_window_default=None,  # required
    swa_rope=(None, True),  # the local layers: rope.freq_base_swa (default rope.freq_base), scaled
    # the softmax over the selected logits already sums to 1 (llama.cpp's norm_w is off for it); the width
    # key is required
    experts=Experts(renormalise=False, gating="softmax_weight", width_key=True),
    dense_ffn_key=False,  # no dense FFN: feed_forward_length is optional
    flags={"attn_sinks": True, "activation": "swiglu_oai"},  # the experts' clamped SwiGLU
    read=read_gpt_oss,
    # llama.cpp requires its own output matrix
    tensor_shapes=partial(llama_family_shapes, adjust_layer=gpt_oss_layer, output_required=True),
)


class GptOssModel(LlamaModel):
    """LlamaModel's loop (the window pattern, the activation, the gating and the Q.K scale are ModelConfig
    settings); the layers add the sinks and read the FFN's norm and biases by gpt-oss's names."""

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        if not be.attention_sinks:
            raise UnsupportedArchitectureError(
                f"{gguf.path}: architecture 'gpt-oss' is not implemented on the {be.name} backend (it has "
                "no attention sinks: use --backend cpu)"
            )
        super().__init__(cfg, gguf, be, progress)

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        attn = load_attention(be, src, cfg, il)  # Q/K/V and output biases as the file has them
        attn.sinks = be.load_vector(src.get(f"blk.{il}.attn_sinks.weight", (cfg.n_heads,)))  # [H]
        ffn = load_moe_feed_forward(be, src, cfg, il, norm="post_attention_norm.weight")
        return attn, ffn


MODEL = GptOssModel
