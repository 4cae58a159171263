"""The per-architecture part of the hyper-parameters (config.py reads what every architecture shares):
one reader per architecture, as llama.cpp's llama_model_<arch> load_hparams reads its keys, and the
experts' counts of the mixture-of-experts architectures.

The readers take the config.ModelConfig being built (config.py imports this module, so it is not imported
here) and set the fields their architecture adds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgellm.gguf.lfm2 import read_lfm2
from edgellm.gguf.metadata import INT32_MAX, get_float, get_int
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import longrope_from_gguf

# The architectures with LayerNorm (weight and bias, {arch}.attention.layer_norm_epsilon) instead of RMSNorm,
# and an ungated GELU MLP with biases (arch/starcoder2.py, arch/gpt2.py).
LAYER_NORM_ARCHS = ("starcoder2", "gpt2")
# Mixture-of-experts architectures (llama too, when its file has experts: Mixtral), and whether llama.cpp
# renormalises the top-k router probabilities to sum to 1 (build_moe_ffn's norm_w for that architecture).
MOE_NORM_WEIGHTS = {"llama": True, "qwen3moe": True, "olmoe": False, "qwen2moe": False, "gpt-oss": False}
# How the router's logits become the selected experts' weights (llama.cpp's expert_gating_func per
# architecture): "softmax" over all experts, then the top k; "softmax_weight": the top k logits, then a
# softmax over those k (gpt-oss).
MOE_GATING = {"gpt-oss": "softmax_weight"}
# The experts' widths key {arch}.expert_feed_forward_length, and whether the file must have it (llama.cpp:
# required for gpt-oss; the Qwen MoEs default to feed_forward_length / expert_used_count).
EXPERT_WIDTH_KEY = {"qwen2moe": False, "qwen3moe": False, "gpt-oss": True}
MAX_EXPERTS = 1 << 16  # a bound for the metadata check: real files have up to a few hundred


def _layer_norm_arch(g: GGUFFile, cfg: Any) -> None:
    """StarCoder 2 and GPT-2 as llama.cpp's llama_model_starcoder2 / _gpt2 read them: LayerNorm with the
    required {arch}.attention.layer_norm_epsilon, MLP up -> GELU -> down with biases; Q is as wide as the
    model (n_heads * head size = n_embd). GPT-2 adds learned positions and no rope (ROPE_NONE)."""
    cfg.layer_norm = True
    eps_key = f"{cfg.arch}.attention.layer_norm_epsilon"
    cfg.layer_norm_eps = get_float(g, eps_key, lo=0.0, hi=1.0, lo_open=True)
    cfg.gated_ffn = False
    cfg.activation = "gelu"
    if cfg.n_heads * cfg.head_dim != cfg.n_embd or cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: {cfg.arch} heads of {cfg.head_dim} (K) / {cfg.head_dim_v} (V) x {cfg.n_heads} must "
            f"span {cfg.arch}.embedding_length = {cfg.n_embd} (llama.cpp's {cfg.arch} shapes)"
        )
    if cfg.arch == "starcoder2" and cfg.rope_dim != cfg.head_dim:  # llama.cpp asserts a full rotation
        raise GGUFError(
            f"{g.path}: metadata starcoder2.rope.dimension_count = {cfg.rope_dim}: partial rotary embedding "
            f"is not implemented for starcoder2 (llama.cpp rotates the whole head of {cfg.head_dim})"
        )


def _phi3(g: GGUFFile, cfg: Any) -> None:
    """Phi-3 / Phi-3.5 / Phi-4-mini as llama.cpp's llama_model_phi3 reads them: fused gate|up, Q|K|V fused
    or not, LongRoPE's factor sets (rope_factors_long / _short, chosen by the context: set_context). The
    files' phi3.attention.sliding_window is read and not applied: llama.cpp disables Phi-3's window."""
    p = "phi3."
    cfg.gate_up_fused = True
    get_int(g, p + "attention.sliding_window", 0, lo=0, hi=INT32_MAX)
    if cfg.n_heads * cfg.head_dim != cfg.n_embd:
        raise GGUFError(
            f"{g.path}: {cfg.n_heads} heads of {cfg.head_dim} are not the model width {cfg.n_embd}: "
            "llama.cpp's Phi-3 projects Q and the attention output at the model width"
        )
    cfg.longrope = longrope_from_gguf(g, "phi3", cfg.rope, cfg.n_ctx_train)
    cfg.rope = cfg.rope_swa = cfg.longrope.short

def read_experts(g: GGUFFile, cfg: Any) -> None:
    """The experts' counts and width as llama.cpp reads them: {arch}.expert_count (required for qwen3moe
    and olmoe, absent or 0 for a dense llama), expert_used_count in 1..expert_count, and the experts' FFN
    width: {arch}.expert_feed_forward_length for the Qwen MoEs (default feed_forward_length /
    expert_used_count, as llama.cpp), feed_forward_length for llama and OLMoE; Qwen 2 MoE's shared expert
    qwen2moe.expert_shared_feed_forward_length wide (default feed_forward_length)."""
    p = cfg.arch + "."
    if cfg.arch == "llama":  # a dense llama (llama.cpp's HARMLESS_AT zeros for the other keys)
        n_expert = get_int(g, p + "expert_count", 0, hi=MAX_EXPERTS)
        if n_expert == 0:
            if get_int(g, p + "expert_used_count", 0) != 0:
                raise GGUFError(f"{g.path}: metadata {p}expert_used_count is set but {p}expert_count is 0")
            return
    else:
        n_expert = get_int(g, p + "expert_count", lo=1, hi=MAX_EXPERTS)
    cfg.n_expert = n_expert
    cfg.n_expert_used = get_int(g, p + "expert_used_count", lo=1, hi=n_expert, why=f"{n_expert} experts")
    cfg.n_ff_exp = cfg.n_ff
    if cfg.arch in EXPERT_WIDTH_KEY:
        kw = {} if EXPERT_WIDTH_KEY[cfg.arch] else {"default": max(1, cfg.n_ff // cfg.n_expert_used)}
        cfg.n_ff_exp = get_int(g, p + "expert_feed_forward_length", lo=1, hi=g.file_size, **kw)
    if cfg.arch == "qwen2moe":
        cfg.n_ff_shexp = get_int(g, p + "expert_shared_feed_forward_length", cfg.n_ff, lo=1, hi=g.file_size)
    cfg.moe_norm_weights = MOE_NORM_WEIGHTS[cfg.arch]
    cfg.moe_gating = MOE_GATING.get(cfg.arch, "softmax")


def _gpt_oss(g: GGUFFile, cfg: Any) -> None:
    """gpt-oss as llama.cpp's llama_model_openai_moe reads it: even layers local with the required
    gpt-oss.attention.sliding_window (pattern 2, as Gemma 2), at rope.freq_base_swa (default
    rope.freq_base) and the global layers' frequency scaling; attention sinks; the experts' clamped SwiGLU
    (swiglu_oai); Q.K scaled by 1/sqrt(rope.dimension_count)."""
    cfg.attn_sinks = True
    cfg.activation = "swiglu_oai"
    cfg.attn_scale = 1.0 / math.sqrt(cfg.rope_dim)
    if cfg.sliding_window == 0:  # llama.cpp's standard window of 0 would mask every key
        raise GGUFError(
            f"{g.path}: metadata gpt-oss.attention.sliding_window = 0: gpt-oss always has a window"
        )
    cfg.swa_layers = swa_pattern(g, "gpt-oss.attention.sliding_window_pattern", cfg.n_layers, 2)


def _gemma2(g: GGUFFile, cfg: Any) -> None:
    """Gemma 2 as llama.cpp's llama_model_gemma2 reads it: every layer soft-caps its attention logits
    (default cap 50) and the logits (default 30); even layers use a 4096-token window by default
    (pattern 2), at rope.freq_base_swa (default: rope.freq_base)."""
    p = "gemma2."
    cfg.post_norms = True
    cfg.activation = "gelu"
    cfg.embd_scale = math.sqrt(cfg.n_embd)
    if cfg.sliding_window == 0:
        raise GGUFError(f"{g.path}: metadata {p}attention.sliding_window = 0: Gemma 2 always has a window")
    cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 2)
    cfg.attn_softcap = get_float(g, p + "attn_logit_softcapping", 50.0, lo=0.0, lo_open=True)
    cfg.final_logit_softcap = get_float(g, p + "final_logit_softcapping", 30.0, lo=0.0, lo_open=True)
    # Gemma 2 27B (46 layers) scales Q by the model width per head (an integer division), the others by
    # the head size.
    if cfg.n_layers == 46:
        cfg.attn_scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_heads)


def _olmo2(g: GGUFFile, cfg: Any) -> None:
    """OLMo 2 (and OLMo 3, the same architecture with a window) as llama.cpp's llama_model_olmo2 reads it:
    no norm before attention or the FFN, a norm after each; Q and K normed over the whole projection. With
    olmo2.attention.sliding_window > 0, layers il % 4 < 3 are local (pattern 4). llama.cpp reads
    rope.freq_base_swa but its OLMo 2 graph rotates local layers at the global rope.freq_base, so here too."""
    p = "olmo2."
    cfg.pre_norms = False
    cfg.post_norms = True
    cfg.qk_norm_full = True
    if cfg.sliding_window > 0:
        cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 4)


def _granite(g: GGUFFile, cfg: Any) -> None:
    """IBM Granite 3.x (dense) as llama.cpp's llama_model_granite reads it: a llama with four multipliers,
    each off at 0 (llama.cpp's default) except logit_scale, which the file must have."""
    p = "granite."
    cfg.logit_scale = get_float(g, p + "logit_scale", lo=0.0, lo_open=True)
    cfg.embd_scale = get_float(g, p + "embedding_scale", 0.0, lo=0.0) or 1.0
    cfg.residual_scale = get_float(g, p + "residual_scale", 0.0, lo=0.0) or 1.0
    cfg.attn_scale = get_float(g, p + "attention.scale", 0.0, lo=0.0) or cfg.attn_scale
    # llama.cpp's Granite turns rope off where rope.scaling.finetuned is false (Granite 4's NoPE layers)
    if not bool(g.get("granite.rope.scaling.finetuned", True)):
        raise GGUFError(
            f"{g.path}: metadata granite.rope.scaling.finetuned = {g.get('granite.rope.scaling.finetuned')} "
            "(no rotary embedding, llama.cpp's NoPE switch for Granite) is not implemented"
        )


def _gemma3(g: GGUFFile, cfg: Any) -> None:
    """Gemma 3 as llama.cpp's llama_model_gemma3 reads it: per-head Q/K norms, norms after attention and
    after the FFN, GeGLU, embeddings times sqrt(n_embd); with a window, five local layers then a global one
    (pattern 6); the logits soft-capped when the file says so."""
    p = "gemma3."
    cfg.qk_norm = True
    cfg.post_norms = True
    cfg.activation = "gelu"
    cfg.embd_scale = math.sqrt(cfg.n_embd)
    if cfg.sliding_window > 0:  # else every layer is global, as in llama.cpp
        cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", cfg.n_layers, 6)
    cfg.final_logit_softcap = get_float(g, p + "final_logit_softcapping", 0.0, lo=0.0)
    # Gemma 3 27B scales by the model width per head; the others by the head size (llama.cpp).
    if cfg.n_layers == 62:
        cfg.attn_scale = 1.0 / math.sqrt(cfg.n_embd / cfg.n_heads)


def _qkv_bias(g: GGUFFile, cfg: Any) -> None:  # g: every reader takes the file
    """Qwen 2 (and its MoE): Q|K|V biases required."""
    cfg.qkv_bias = True


def _qk_norm(g: GGUFFile, cfg: Any) -> None:
    """Qwen 3 (and its MoE): per-head RMSNorm of Q and K."""
    cfg.qk_norm = True


def _qk_norm_full(g: GGUFFile, cfg: Any) -> None:
    """OLMoE: Q and K normed over the whole projection, after the usual pre-norm."""
    cfg.qk_norm_full = True


# What each architecture adds to the shared hyper-parameters (llama, SmolLM3: nothing, but the NoPE layers
# config.NO_ROPE_LAYER_STEP sets).
ARCH_READERS = {
    "qwen2": _qkv_bias, "qwen2moe": _qkv_bias, "qwen3": _qk_norm, "qwen3moe": _qk_norm,
    "olmoe": _qk_norm_full, "gemma3": _gemma3, "gemma2": _gemma2, "granite": _granite, "olmo2": _olmo2,
    "starcoder2": _layer_norm_arch, "gpt2": _layer_norm_arch, "phi3": _phi3, "lfm2": read_lfm2,
    "gpt-oss": _gpt_oss,
}  # fmt: skip


def swa_pattern(g: GGUFFile, key: str, n_layers: int, default: int) -> list[bool]:
    """Which layers use the sliding window, as llama.cpp's load_swa_pattern reads `key`: an array of one
    flag per layer, or a period n (default `default`: Gemma 3's five local layers, then a global one) where
    layer il is local when il % n < n - 1, every layer when n is 0."""
    value = g.get(key, default)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "biu":
        if len(value) != n_layers:
            raise GGUFError(
                f"{g.path}: metadata {key} has {len(value)} per-layer flags for {n_layers} layers"
            )
        return [bool(v) for v in value]
    n = get_int(g, key, default, lo=0, hi=INT32_MAX)
    return [n == 0 or il % n < n - 1 for il in range(n_layers)]
