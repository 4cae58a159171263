"""GLM-4.5 MoE decoder (GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7; llama.cpp's LLM_ARCH_GLM4_MOE,
src/models/glm4-moe.cpp): biased attention with partial NEOX rope, leading dense layers, then experts
chosen by sigmoid gating with a selection bias, plus an ungated shared expert.

x = embed(tokens)                                  # [T, n_embd]
for each layer il:
    q, k, v = Wq h + bq, Wk h + bk, Wv h + bv      # h = rmsnorm(x) * attn_norm; optional per-head Q/K norms
    x += Wo @ attention(rope(q), rope(k), v)       # rope on the first rope.dimension_count dims of a head
    h = rmsnorm(x) * post_attention_norm           # the FFN's pre-norm, whatever its name
    il < leading_dense_block_count:  x += W_down @ (silu(W_gate h) * (W_up h))      # n_ff wide
    else:                                          # arch/moe.py
        p = sigmoid(W_router h)                    # [T, n_expert]
        sel = top-k(p + exp_probs_b)               # the bias chooses, it does not weight
        w = p[sel] / sum(p[sel]) (expert_weights_norm) * expert_weights_scale
        x += sum_s w_s FFN_sel_s(h) + FFN_shared(h)   # shared: expert_shared_count experts' width, no gate
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to the embedding when the file has no output

Tensors beyond llama's attention (numpy order): attn_{q,k,v}.bias (optional, as create_tensor_qkv),
attn_{q,k}_norm.weight [d] (optional: GLM-4.5 355B), post_attention_norm.weight [n_embd]; dense layers
ffn_{gate,up}.weight [n_ff, n_embd], ffn_down.weight [n_embd, n_ff]; expert layers ffn_gate_inp.weight
[E, n_embd], exp_probs_b.bias [E], ffn_{gate,up}_exps.weight [E, n_ff_exp, n_embd], ffn_down_exps.weight
[E, n_embd, n_ff_exp], ffn_{gate,up}_shexp.weight [n_ff_exp * n_shared, n_embd], ffn_down_shexp.weight
[n_embd, n_ff_exp * n_shared]. Multi-token-prediction layers (the last nextn_predict_layers of
block_count) are skipped as llama.cpp skips them; M-RoPE sections (GLM-4.5V) are refused at load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgellm.arch.common import TensorSource, feed_forward_block, load_attention, load_feed_forward
from edgellm.arch.llama import LlamaModel
from edgellm.arch.moe import MoeFeedForwardWeights, load_moe_feed_forward, moe_feed_forward_block
from edgellm.arch.spec import (
    DENSE_FFN,
    EXPERT_GROUP_KEYS,
    EXPERT_KEYS,
    EXPERT_TENSORS,
    LLAMA_BLOCK,
    QK_NORMS,
    QKV_BIASES,
    ArchSpec,
    Experts,
    Shapes,
    llama_family_shapes,
)
from edgellm.gguf.metadata import get_float, get_int
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

FFN_NORM = "post_attention_norm.weight"  # llama.cpp's attn_post_norm: the FFN's pre-norm
SHARED_EXPERT = frozenset({"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
SELECTION_BIAS = "exp_probs_b.bias"
# llama.cpp's llama_expert_gating_func_type values -> arch/moe.py's gating (0, none: GLM's sigmoid)
GATING_FUNCS = {0: "sigmoid", 1: "softmax", 2: "sigmoid"}


def read_glm4moe(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama_model_glm4_moe::load_arch_hparams reads them: expert_shared_count (required), the shared
    experts one FFN of n_ff_exp * count; leading_dense_block_count (default 0); expert_weights_norm
    (default false), expert_weights_scale (default 0: none), expert_gating_func (default sigmoid);
    per-head Q/K norms where the file has them."""
    p = "glm4moe."
    n_shared = get_int(g, p + "expert_shared_count", lo=0, hi=cfg.n_expert)
    cfg.n_ff_shexp = cfg.n_ff_exp * n_shared
    cfg.shared_expert_gate = False
    cfg.n_layer_dense_lead = get_int(g, p + "leading_dense_block_count", 0, lo=0, hi=cfg.n_layers)
    cfg.moe_norm_weights = bool(g.get(p + "expert_weights_norm", False))
    cfg.moe_weights_scale = get_float(g, p + "expert_weights_scale", 0.0, lo=0.0)
    func = get_int(g, p + "expert_gating_func", 0)
    if func not in GATING_FUNCS:
        raise GGUFError(
            f"{g.path}: metadata {p}expert_gating_func = {func} is not implemented for glm4moe "
            f"(implemented: {sorted(GATING_FUNCS)}: none / softmax / sigmoid)"
        )
    cfg.moe_gating = GATING_FUNCS[func]
    cfg.qk_norm = "blk.0.attn_q_norm.weight" in g.tensors


def glm4moe_shapes(cfg: ModelConfig) -> Shapes:
    """Every tensor the model reads -> its shape: llama's attention, post_attention_norm as the FFN's
    norm, a dense FFN in the leading layers, the experts with their selection bias and the ungated shared
    expert in the others."""
    shapes = llama_family_shapes(cfg)
    e, f, E = cfg.n_embd, cfg.n_ff, cfg.n_expert
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        del shapes[p + "ffn_norm.weight"]
        shapes[p + FFN_NORM] = (e,)
        shapes.pop(p + "ffn_gate_inp_shexp.weight", None)
        if il < cfg.n_layer_dense_lead:
            for name in EXPERT_TENSORS | SHARED_EXPERT:
                shapes.pop(p + name, None)
            shapes.update(
                {p + "ffn_gate.weight": (f, e), p + "ffn_up.weight": (f, e), p + "ffn_down.weight": (e, f)}
            )
        else:
            shapes[p + SELECTION_BIAS] = (E,)
    return shapes


SPEC = ArchSpec(
    name="glm4moe",
    block_tensors=(LLAMA_BLOCK - {"ffn_norm.weight"})
    | QKV_BIASES
    | QK_NORMS
    | {FFN_NORM, SELECTION_BIAS}
    | EXPERT_TENSORS
    | SHARED_EXPERT
    | DENSE_FFN,
    keys=EXPERT_KEYS
    | EXPERT_GROUP_KEYS
    | {
        "expert_feed_forward_length",
        "expert_shared_count",
        "leading_dense_block_count",
        "expert_weights_norm",
        "expert_weights_scale",
        "expert_gating_func",
        "nextn_predict_layers",
    },
    nextn_layers=True,  # GLM-4.5's and DeepSeek V3's released files carry one
    fused_qkv=True,
    # the gating, the norm and the scale: read_glm4moe (from keys); the width key is required
    experts=Experts(renormalise=False, gating="sigmoid", width_key=True, groups=True),
    read=read_glm4moe,
    tensor_shapes=glm4moe_shapes,
)


def glm4moe_ffn_block(be: Backend, cfg: ModelConfig, w: Any, x: Any, T: int) -> None:
    """The layer's FFN: the experts (arch/moe.py), or a leading layer's dense one."""
    if isinstance(w, MoeFeedForwardWeights):
        moe_feed_forward_block(be, cfg, w, x, T)
    else:
        feed_forward_block(be, cfg, w, x, T)


class Glm4MoeModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        super().__init__(cfg, gguf, be, progress)
        self.ffn_block = glm4moe_ffn_block
        # the blocks' kernel calls: a backend's one-call layer is not checked against partial rope
        self.fused = [None] * cfg.n_layers

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        attn = load_attention(be, src, cfg, il)
        if il < cfg.n_layer_dense_lead:
            return attn, load_feed_forward(be, src, cfg, il, norm=FFN_NORM)
        return attn, load_moe_feed_forward(be, src, cfg, il, norm=FFN_NORM)


MODEL = Glm4MoeModel
