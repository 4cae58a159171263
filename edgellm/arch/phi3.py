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
from edgellm.arch.spec import GLOBAL_TENSORS, LLAMA_BLOCK, QKV_BIASES, ArchSpec
from edgellm.gguf.metadata import INT32_MAX, get_int
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import LONGROPE_TENSORS, longrope_from_gguf


def read_phi3(g: GGUFFile, cfg: ModelConfig) -> None:
    """As llama.cpp's llama_model_phi3 reads it: LongRoPE's factor sets (rope_factors_long / _short, chosen
    by the context: ModelConfig.set_context). The file's phi3.attention.sliding_window is read and not
    applied: llama.cpp disables Phi-3's window."""
    get_int(g, "phi3.attention.sliding_window", 0, lo=0, hi=INT32_MAX)
    if cfg.n_heads * cfg.head_dim != cfg.n_embd:
        raise GGUFError(
            f"{g.path}: {cfg.n_heads} heads of {cfg.head_dim} are not the model width {cfg.n_embd}: "
            "llama.cpp's Phi-3 projects Q and the attention output at the model width"
        )
    cfg.longrope = longrope_from_gguf(g, "phi3", cfg.rope, cfg.n_ctx_train)
    cfg.rope = cfg.rope_swa = cfg.longrope.short


SPEC = ArchSpec(
    name="phi3",
    # gate|up fused into ffn_up (2 * n_ff rows); no other bias than Q|K|V's (llama_model_phi3)
    block_tensors=(LLAMA_BLOCK - {"ffn_gate.weight"}) | QKV_BIASES,
    keys=frozenset({"attention.sliding_window"}),  # read and unused, as llama.cpp's Phi-3
    global_tensors=GLOBAL_TENSORS | set(LONGROPE_TENSORS),
    fused_qkv=True,  # Q|K|V fused or not, per layer
    flags={"gate_up_fused": True},
    read=read_phi3,
)


class Phi3Model(LlamaModel):
    """LlamaModel's loop: the fused matrices load as the stacked ones do (cfg.qkv_fused, cfg.gate_up_fused)
    and the LongRoPE factors are the rope's frequency factors (gguf/rope.py LongRope)."""


MODEL = Phi3Model
