"""The model's hyper-parameters as one dataclass, apart from the code that reads them from a file
(config.py): the architecture files (edgellm/arch/) read it and config.py reads their specs, so both import
it from here and neither imports the other's reader."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgellm.gguf.reader import GGUFError
from edgellm.gguf.rope import LongRope, RopeParams

# Rotary layouts as in llama.cpp: NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama's converter permutes
# Q/K rows for it); NEOX rotates the two halves (x[i], x[i + d/2]).
ROPE_NORM = 0
ROPE_NEOX = 2
ROPE_NONE = -1  # no rotary embedding (GPT-2: learned absolute position embeddings)
# The CUDA attention kernel holds a query head in shared memory of this size (cuda/config.py MAX_HEAD_DIM;
# the CPU kernels have no limit): one limit for both keeps a file loadable on either backend.
MAX_HEAD_DIM = 512


class UnsupportedArchitectureError(GGUFError):
    """An architecture, or a part of one, that edgellm does not run (on this backend)."""


@dataclass
class ModelConfig:
    arch: str
    name: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # per-head size of Q and K
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope: RopeParams  # the rotary embedding of every layer but the sliding-window ones
    rope_swa: RopeParams  # the sliding-window layers' (Gemma 3; the same object as rope elsewhere)
    rope_dim: int  # rotated dims per head (the rest pass through)
    rope_type: int
    attn_scale: float  # multiplies Q.K before the softmax
    # Gemma 3: layers marked True use the sliding window; they also use rope_swa.
    sliding_window: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    embd_scale: float = 1.0  # Gemma multiplies token embeddings by sqrt(n_embd)
    qk_norm: bool = False  # per-head RMSNorm of Q and K (Gemma 3, Qwen 3)
    qk_norm_full: bool = False  # RMSNorm of Q and of K over the whole projection instead (OLMo 2)
    pre_norms: bool = True  # the norms before attention and before the FFN (OLMo 2 has none)
    qkv_bias: bool = False  # Q|K|V biases required (Qwen 2); any arch applies those its file has
    post_norms: bool = False  # Gemma's extra norms after attention and after the FFN
    activation: str = "silu"  # gated FFN: silu (SwiGLU) or gelu (GeGLU, tanh form)
    final_logit_softcap: float = 0.0
    attn_softcap: float = 0.0  # Gemma 2: Q.K capped to cap * tanh(. / cap) before the softmax
    residual_scale: float = 1.0  # Granite: each block's output times this before the residual add
    logit_scale: float = 1.0  # Granite: logits divided by this
    layer_norm: bool = False  # LayerNorm (x - mean) / sqrt(var + eps) * w + b everywhere RMSNorm would be
    layer_norm_eps: float = 1e-5
    gated_ffn: bool = True  # False: W_down @ act(W_up h) (StarCoder 2, GPT-2), no ffn_gate
    causal: bool = True  # False: an encoder (arch/encoder.py): bidirectional attention, embeddings only
    n_cls_out: int = 1  # a classification head's outputs ({arch}.classifier.output_labels; rerankers: 1)
    # pooling "rank" has a head to run: every encoder (its cls / cls.output, each optional as llama.cpp);
    # Qwen 3 with cls.output (a Qwen3-Reranker: softmax over its labels at the last token)
    rank_head: bool = False
    pooling: str = "mean"  # how an embedding pools the final hidden states (engine/checks.py POOLABLE)
    # layers whose Q|K|V come as one attn_qkv.weight (Phi-3; any architecture may, as llama.cpp reads it)
    qkv_fused: list[bool] = field(default_factory=list)
    gate_up_fused: bool = False  # gate|up as one ffn_up.weight of 2 * n_ff rows, no ffn_gate (Phi-3)
    no_rope_layers: list[bool] = field(default_factory=list)  # layers without rotary embedding (SmolLM3)
    longrope: LongRope | None = None  # Phi-3's two factor sets: set_context picks rope from them
    # Mixture of experts (0 experts: a dense FFN): each token's FFN is the router-weighted sum of
    # n_expert_used of n_expert expert FFNs of width n_ff_exp.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    moe_norm_weights: bool = False  # renormalise the selected experts' probabilities to sum to 1
    n_ff_shexp: int = 0  # a shared expert every token runs, gated by sigmoid(w . h) (Qwen 2 MoE); 0: none
    # Layers marked True keep a per-sequence recurrent state instead of K/V (LFM2's short convolutions over
    # the last conv_l_cache tokens; Qwen 3.5's Gated DeltaNet layers): each sequence then carries that
    # state beside its KV blocks (engine/conv_state.py)
    conv_layers: list[bool] = field(default_factory=list)
    conv_l_cache: int = 0
    # Gated DeltaNet (arch/deltanet.py; llama.cpp's ssm_* hparams): conv width, key/value head size,
    # key heads (ssm.group_count), value heads (ssm.time_step_rank); 0: none
    ssm_conv_kernel: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0

    @property
    def recurrent(self) -> bool:
        """A sequence's state is more than its KV blocks (no prefix-cache hits, no speculative rollback)."""
        return any(self.conv_layers)

    @property
    def n_kv_layers(self) -> int:
        """Layers with K/V in the cache: all but the short-conv ones, in order (the KV cache's layers)."""
        return self.n_layers - sum(self.conv_layers)

    moe_gating: str = "softmax"  # arch/spec.py Experts.gating
    moe_weights_scale: float = 1.0  # the selected experts' weights times this ({arch}.expert_weights_scale)
    moe_select_by_logits: bool = False  # top-k of the router's logits, not of its probabilities (Llama 4)
    moe_weight_before_ffn: bool = False  # each expert's input times its weight, its output summed (Llama 4)
    shared_expert_gate: bool = True  # the shared expert gated by sigmoid(ffn_gate_inp_shexp . h); else 1
    # the first n layers have a dense FFN of feed_forward_length in place of the experts (GLM-4.5, DeepSeek)
    n_layer_dense_lead: int = 0
    # DeepSeek V3: the experts in n_expert_groups groups, a token's chosen from the n_group_used groups of
    # largest top-2 sum (0 or 1 group: no restriction)
    n_expert_groups: int = 0
    n_group_used: int = 0
    n_nextn_layers: int = 0  # multi-token prediction layers after the n_layers (ArchSpec.nextn_layers)
    # Multi-head latent attention (DeepSeek 2, arch/deepseek2.py): the q-LoRA rank (0: none), the latent's
    # width r, and a head's K (nope + rope) and V widths before absorption
    mla_q_lora_rank: int = 0
    mla_kv_lora_rank: int = 0
    mla_head_dim_k: int = 0
    mla_head_dim_v: int = 0
    # gpt-oss: each head's learned logit in its softmax's denominator (blk.N.attn_sinks.weight [H])
    attn_sinks: bool = False
    # Attention temperature tuning (Llama 4's, Ministral 3's {arch}.attention.temperature_scale): Q at
    # position p times 1 + attn_temp_scale * ln(floor((p + attn_temp_offset) / attn_temp_floor) + 1);
    # 0: off
    attn_temp_scale: float = 0.0
    attn_temp_floor: int = 1
    attn_temp_offset: float = 0.0
    attn_temp_nope_only: bool = False  # the temperature on the layers without rope only (Llama 4)
    qk_norm_after_rope: bool = False  # Q and K RMS-normalised without a weight after rope (Llama 4's L2 norm)
    max_n_ctx: int = 0  # the largest context edgellm runs the model at exactly (Llama 4's chunks); 0: any
    llama4_moe_step: int = 0  # Llama 4: the experts on layers (il + 1) % step == 0, a dense FFN elsewhere

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def rope_of_layer(self, il: int) -> RopeParams | None:
        """The rotary embedding of layer il; None for a layer without one (GPT-2's learned positions,
        SmolLM3's NoPE layers)."""
        if self.rope_type == ROPE_NONE or (self.no_rope_layers and self.no_rope_layers[il]):
            return None
        return self.rope_swa if self.swa_layers[il] else self.rope

    def set_context(self, n_ctx: int) -> None:
        """Settle what llama.cpp chooses by the context window (n_ctx tokens per sequence): LongRoPE's long
        frequency factors when it exceeds the original context, else the short ones (the default here)."""
        if self.max_n_ctx and n_ctx > self.max_n_ctx:
            raise UnsupportedArchitectureError(
                f"{self.arch}: a context of {n_ctx} tokens needs chunked attention past {self.max_n_ctx} "
                f"tokens, which edgellm does not implement: use n_ctx <= {self.max_n_ctx}"
            )
        if self.longrope is not None:
            self.rope = self.rope_swa = self.longrope.for_context(n_ctx)
