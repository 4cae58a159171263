"""Model hyper-parameters from GGUF metadata, per architecture (keys as llama.cpp's converters write them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgellm.gguf.reader import GGUFError, GGUFFile

SUPPORTED_ARCHS = ("llama", "gemma3", "qwen2", "qwen3")

# Rotary layouts as in llama.cpp: NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama's converter permutes
# Q/K rows for it); NEOX rotates the two halves (x[i], x[i + d/2]).
ROPE_NORM = 0
ROPE_NEOX = 2


class UnsupportedArchitectureError(GGUFError):
    pass


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
    rope_base: float
    rope_dim: int  # rotated dims per head (the rest pass through)
    rope_type: int
    attn_scale: float  # multiplies Q.K before the softmax
    # Gemma 3: layers marked True use the sliding window; they also use rope_base_swa.
    sliding_window: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    rope_base_swa: float = 10000.0
    embd_scale: float = 1.0  # Gemma multiplies token embeddings by sqrt(n_embd)
    qk_norm: bool = False  # per-head RMSNorm of Q and K (Gemma 3, Qwen 3)
    qkv_bias: bool = False  # Qwen 2
    post_norms: bool = False  # Gemma's extra norms after attention and after the FFN
    activation: str = "silu"  # gated FFN: silu (SwiGLU) or gelu (GeGLU, tanh form)
    final_logit_softcap: float = 0.0

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def _req(g: GGUFFile, key: str) -> object:
    if key not in g.metadata:
        raise GGUFError(f"{g.path}: missing metadata key {key!r}")
    return g.metadata[key]


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    arch = g.architecture
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedArchitectureError(
            f"{g.path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    p = f"{arch}."
    n_embd = int(_req(g, p + "embedding_length"))
    n_heads = int(_req(g, p + "attention.head_count"))
    n_kv_heads = g.get(p + "attention.head_count_kv", n_heads)
    if isinstance(n_kv_heads, np.ndarray):  # per-layer arrays exist in some files; all equal here
        n_kv_heads = n_kv_heads.max()
    if n_heads <= 0 or int(n_kv_heads) <= 0:
        raise GGUFError(
            f"{g.path}: head counts must be positive: {p}attention.head_count={n_heads}, "
            f"{p}attention.head_count_kv={n_kv_heads}"
        )
    head_dim = int(g.get(p + "attention.key_length", n_embd // n_heads))
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = int(g.get(p + "vocab_size", len(tokens) if tokens is not None else 0))
    if "token_embd.weight" in g.tensors:
        n_vocab = g.tensors["token_embd.weight"].shape[0]
        if tokens is not None and len(tokens) != n_vocab:
            raise GGUFError(
                f"{g.path}: tensor 'token_embd.weight' has {n_vocab} rows but the vocabulary has "
                f"{len(tokens)} tokens"
            )
    n_layers = int(_req(g, p + "block_count"))
    cfg = ModelConfig(
        arch=arch,
        name=str(g.get("general.name", g.path.stem)),
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=int(_req(g, p + "feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(n_kv_heads),
        head_dim=head_dim,
        head_dim_v=int(g.get(p + "attention.value_length", head_dim)),
        n_vocab=n_vocab,
        n_ctx_train=int(g.get(p + "context_length", 2048)),
        rms_eps=float(g.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_base=float(g.get(p + "rope.freq_base", 10000.0)),
        rope_dim=int(g.get(p + "rope.dimension_count", head_dim)),
        rope_type=ROPE_NORM if arch == "llama" else ROPE_NEOX,
        attn_scale=1.0 / math.sqrt(head_dim),
        swa_layers=[False] * n_layers,
    )
    if arch == "qwen2":
        cfg.qkv_bias = True
    elif arch == "qwen3":
        cfg.qk_norm = True
    elif arch == "gemma3":
        cfg.qk_norm = True
        cfg.post_norms = True
        cfg.activation = "gelu"
        cfg.embd_scale = math.sqrt(n_embd)
        cfg.sliding_window = int(g.get(p + "attention.sliding_window", 0))
        # llama.cpp: five local (sliding-window, rope base 10k) layers, then one global layer.
        cfg.swa_layers = [cfg.sliding_window > 0 and il % 6 < 5 for il in range(n_layers)]
        cfg.rope_base_swa = 10000.0
        cfg.final_logit_softcap = float(g.get(p + "final_logit_softcapping", 0.0) or 0.0)
        # Gemma 3 27B scales by the model width per head; the others by the head size (llama.cpp).
        if n_layers == 62:
            cfg.attn_scale = 1.0 / math.sqrt(n_embd / n_heads)
    if n_heads % cfg.n_kv_heads:
        raise GGUFError(
            f"{g.path}: {n_heads} attention heads are not a multiple of {cfg.n_kv_heads} KV heads"
        )
    return cfg
