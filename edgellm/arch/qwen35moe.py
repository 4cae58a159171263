"""Qwen 3.5 / 3.6 MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen 3.5's layers (arch/qwen35.py: Gated DeltaNet and
gated full attention) with a mixture of experts and a shared expert as FFN, as llama.cpp's
llama_model_qwen35moe (src/models/qwen35moe.cpp) runs it.

    x += DeltaNet(h) or GatedAttention(h)                     with h = rmsnorm(x) * attn_norm
    x += MoE(h) + sigmoid(w_shexp . h) * FFN_shexp(h)         with h = rmsnorm(x) * post_attention_norm

MoE (arch/moe.py): qwen35moe.expert_count experts of width qwen35moe.expert_feed_forward_length (default
feed_forward_length / expert_used_count), expert_used_count per token, their softmax probabilities
renormalised over the selected ones (llama.cpp's norm_w true, no weight scale); the shared expert
expert_shared_feed_forward_length wide (default feed_forward_length), its gate a vector
(ffn_gate_inp_shexp) the block multiplies as one more row of the router, as Qwen 2 MoE's.
"""

from __future__ import annotations

from typing import Any

from edgellm.arch.common import TensorSource
from edgellm.arch.deltanet import DELTANET_TENSORS
from edgellm.arch.moe import load_moe_feed_forward
from edgellm.arch.qwen2moe import SHARED_EXPERT
from edgellm.arch.qwen35 import (
    ATTENTION_TENSORS,
    HYBRID_KEYS,
    LAYER_TENSORS,
    MTP_TENSORS,
    Qwen35Model,
    hybrid_layer_check,
    hybrid_shapes,
    read_qwen35,
)
from edgellm.arch.spec import DENSE_FFN, EXPERT_KEYS, EXPERT_TENSORS, ArchSpec, Experts, Shapes
from edgellm.gguf.model_config import ModelConfig


def qwen35moe_shapes(cfg: ModelConfig) -> Shapes:
    e, E, fe, fs = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp
    ffn = {
        "ffn_gate_inp.weight": (E, e),
        "ffn_gate_exps.weight": (E, fe, e),
        "ffn_up_exps.weight": (E, fe, e),
        "ffn_down_exps.weight": (E, e, fe),
        "ffn_gate_inp_shexp.weight": (e,),
        "ffn_gate_shexp.weight": (fs, e),
        "ffn_up_shexp.weight": (fs, e),
        "ffn_down_shexp.weight": (e, fs),
    }
    return hybrid_shapes(cfg, ffn)


SPEC = ArchSpec(
    name="qwen35moe",
    block_tensors=(LAYER_TENSORS - DENSE_FFN)
    | EXPERT_TENSORS
    | SHARED_EXPERT
    | ATTENTION_TENSORS
    | DELTANET_TENSORS
    | MTP_TENSORS,
    keys=HYBRID_KEYS | EXPERT_KEYS | {"expert_feed_forward_length", "expert_shared_feed_forward_length"},
    experts=Experts(renormalise=True, width_key=False, shared=True),
    read=read_qwen35,
    tensor_shapes=qwen35moe_shapes,
    check=hybrid_layer_check(qwen35moe_shapes),
)


class Qwen35MoeModel(Qwen35Model):
    """Qwen35Model with the experts (and the shared expert) as each layer's FFN (LlamaModel picks
    moe_feed_forward_block for them from cfg.n_expert)."""

    def load_ffn(self, src: TensorSource, il: int) -> Any:
        return load_moe_feed_forward(self.be, src, self.cfg, il, norm="post_attention_norm.weight")


MODEL = Qwen35MoeModel
