"""Phi-3 decoder (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini).

    x = embed(tokens)                                  # [T, n_embd]
    for each layer:
        q|k|v = W_qkv h,  h = rmsnorm(x) * attn_norm   # one fused matrix [(H + 2*Hkv) * d, n_embd]
        x += Wo @ attention(rope(q), rope(k), v)       # Q.K / sqrt(d)
        g|u = W_up h,     h = rmsnorm(x) * ffn_norm    # ffn_up holds gate|up [2 * n_ff, n_embd]
        x += W_down @ (silu(g) * u)
    logits = W_out @ (rmsnorm(x) * output_norm)

Rope rotates halves (NEOX), possibly only part of each head (Phi-4-mini: rope.dimension_count 96 of 128).
LongRoPE: every frequency is divided by a factor of rope_factors_short.weight, or of rope_factors_long.weight
when the context window exceeds phi3.rope.scaling.original_context_length (ModelConfig.set_context, as
llama.cpp chooses per context, not per position); cos and sin are times rope.scaling.attn_factor (the
converter's sqrt(1 + ln(scale) / ln(original context))). phi3.attention.sliding_window is not applied:
llama.cpp disables Phi-3's window.
"""

from __future__ import annotations

from edgellm.arch.llama import LlamaModel


class Phi3Model(LlamaModel):
    """LlamaModel's loop: the fused matrices load as the stacked ones do (cfg.qkv_fused, cfg.gate_up_fused)
    and the LongRoPE factors are the rope's frequency factors (gguf/rope.py LongRope)."""
