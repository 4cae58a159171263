"""Llama 4 decoder (Llama 4 Scout 17B-16E, Maverick 17B-128E; llama.cpp's LLM_ARCH_LLAMA4,
src/models/llama4.cpp, the interleaved form its converter writes): iRoPE layers, a mixture of experts on
every interleave_moe_layer_step-th layer.

x = embed(tokens)                                  # [T, n_embd]
for each layer il:
    h = rmsnorm(x) * attn_norm
    (il + 1) % 4 != 0 (chunked layers):            # rope (rope_freqs factors, base rope.freq_base_swa)
        q, k = rms(rope(Wq h)), rms(rope(Wk h))    # then each head RMS-normalised, no weight (but 128E)
    else (global layers, no rope):
        q = Wq h * (1 + 0.1 ln(floor((pos + 1) / 8192) + 1))   # temperature tuning
    x += Wo @ attention(q, k, Wv h)
    h = rmsnorm(x) * ffn_norm
    (il + 1) % step == 0:                          # experts: sigmoid weights of the top-k logits, applied
        x += sum_s FFN_sel_s(h * sigmoid(z_sel_s)) + FFN_shared(h)     # to the expert's input
    else: x += W_down @ (silu(W_gate h) * (W_up h))
logits = W_out @ (rmsnorm(x) * output_norm)

llama.cpp's chunked attention (keys only from the query's own 8192-token chunk on the rope layers) equals
causal attention within the first 8192 positions: edgellm runs Llama 4 at contexts up to 8192 tokens and
refuses a larger n_ctx (ModelConfig.max_n_ctx) rather than attend across chunks. A file with
attention.sliding_window = 0 (llama.cpp's no-chunk form) is refused.

Tensors (numpy order): llama's attention (optional Q/K/V biases), ffn_norm; dense layers ffn_{gate,up}
[n_ff, n_embd], ffn_down [n_embd, n_ff]; expert layers ffn_gate_inp [E, n_embd], ffn_{gate,up}_exps
[E, n_ff_exp, n_embd], ffn_down_exps [E, n_embd, n_ff_exp], ffn_{gate,up}_shexp [n_ff_exp, n_embd],
ffn_down_shexp [n_embd, n_ff_exp]; rope_freqs.weight [n_rot / 2] (optional).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgellm.arch.common import TensorSource, load_attention, load_feed_forward
from edgellm.arch.glm4moe import SHARED_EXPERT, glm4moe_ffn_block
from edgellm.arch.llama import LlamaModel
from edgellm.arch.moe import load_moe_feed_forward
from edgellm.arch.spec import (
    EXPERT_KEYS,
    EXPERT_TENSORS,
    LLAMA_BLOCK,
    QKV_BIASES,
    SLIDING_WINDOW_KEYS,
    ArchSpec,
    Experts,
    Shapes,
    llama_family_shapes,
    swa_pattern,
)
from edgellm.gguf.metadata import get_int
from edgellm.gguf.model_config import ROPE_NORM, ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

CHUNK = 8192  # llama.cpp's n_swa for Llama 4, whatever the file says


def read_llama4(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama_model_llama4::load_arch_hparams (the chunked form): interleave_moe_layer_step (required),
    the chunk pattern (default: 3 chunked layers, then a global one), no rope on every fourth layer,
    temperature tuning there (scale 0.1, floor 8192, offset 1), the L2 norm unless 128 experts."""
    p = "llama4."
    if p + "attention.sliding_window" in g.metadata and get_int(g, p + "attention.sliding_window") == 0:
        raise GGUFError(
            f"{g.path}: {p}attention.sliding_window = 0 (no chunked attention) is not implemented"
        )
    cfg.llama4_moe_step = get_int(g, p + "interleave_moe_layer_step", lo=0, hi=cfg.n_layers)
    cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 4)
    cfg.sliding_window = 0  # chunks, not a window: exact up to max_n_ctx
    cfg.max_n_ctx = CHUNK
    cfg.no_rope_layers = [(il + 1) % 4 == 0 for il in range(cfg.n_layers)]
    cfg.attn_temp_scale, cfg.attn_temp_floor, cfg.attn_temp_offset = 0.1, CHUNK, 1.0
    cfg.attn_temp_nope_only = True
    cfg.qk_norm_after_rope = cfg.n_expert != 128
    cfg.n_ff_shexp = cfg.n_ff_exp  # one shared expert as wide as a routed one
    cfg.shared_expert_gate = False
    cfg.moe_select_by_logits = cfg.moe_weight_before_ffn = True


def is_moe_layer(cfg: ModelConfig, il: int) -> bool:
    return cfg.llama4_moe_step > 0 and (il + 1) % cfg.llama4_moe_step == 0


def llama4_shapes(cfg: ModelConfig) -> Shapes:
    """llama's tensors, the experts (and the shared one, no gate) on the MoE layers, a dense FFN n_ff wide
    on the others."""
    shapes = llama_family_shapes(cfg)
    e, f = cfg.n_embd, cfg.n_ff
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        shapes.pop(p + "ffn_gate_inp_shexp.weight", None)
        if not is_moe_layer(cfg, il):
            for name in EXPERT_TENSORS | SHARED_EXPERT:
                shapes.pop(p + name, None)
            shapes.update(
                {p + "ffn_gate.weight": (f, e), p + "ffn_up.weight": (f, e), p + "ffn_down.weight": (e, f)}
            )
    return shapes


SPEC = ArchSpec(
    name="llama4",
    block_tensors=LLAMA_BLOCK | QKV_BIASES | EXPERT_TENSORS | SHARED_EXPERT,
    keys=EXPERT_KEYS
    | SLIDING_WINDOW_KEYS
    | {"expert_feed_forward_length", "interleave_moe_layer_step", "rope.freq_base_swa"},
    fused_qkv=True,
    rope_type=ROPE_NORM,
    rope_freq_factors=True,
    # read to refuse 0 (read_llama4); the default makes the chunked layers take rope.freq_base_swa
    sliding_window=True,
    sliding_window_default=CHUNK,
    swa_rope=(None, True),  # the rope layers are the chunked ones: rope.freq_base_swa, scaled
    experts=Experts(renormalise=False, gating="sigmoid", width_key=True),
    read=read_llama4,
    tensor_shapes=llama4_shapes,
)


class Llama4Model(LlamaModel):
    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        super().__init__(cfg, gguf, be, progress)
        self.ffn_block = glm4moe_ffn_block  # the experts, or a dense layer's FFN
        self.fused = [None] * cfg.n_layers  # the L2 norm and the temperature: the blocks' kernel calls

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        attn = load_attention(be, src, cfg, il)
        if is_moe_layer(cfg, il):
            return attn, load_moe_feed_forward(be, src, cfg, il)
        return attn, load_feed_forward(be, src, cfg, il)


MODEL = Llama4Model
