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

from typing import Any

from edgellm.arch.common import TensorSource, load_attention
from edgellm.arch.llama import LlamaModel
from edgellm.arch.moe import load_moe_feed_forward
from edgellm.backends.base import Backend
from edgellm.gguf.config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFFile


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
