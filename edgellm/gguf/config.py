"""Model hyper-parameters from GGUF metadata (keys as llama.cpp's converters write them): the keys every
architecture shares here, what each one adds in arch_config.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgellm.gguf.arch_config import ARCH_READERS, MOE_NORM_WEIGHTS, read_experts
from edgellm.gguf.lfm2 import lfm2_head_counts
from edgellm.gguf.metadata import INT32_MAX, check_int_range, describe, get_float, get_int, get_str, is_int
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import LongRope, RopeParams, rope_from_gguf

SUPPORTED_ARCHS = (
    "llama", "gemma2", "gemma3", "granite", "olmo2", "olmoe", "qwen2", "qwen2moe", "qwen3", "qwen3moe",
    "starcoder2", "gpt2", "phi3", "smollm3", "lfm2", "gpt-oss",
)  # fmt: skip
# Architectures llama.cpp runs that are refused here by name, with what they would need.
KNOWN_UNSUPPORTED: dict[str, str] = {}
# The architectures with sliding-window layers, and the window when {arch}.attention.sliding_window is
# missing (llama.cpp's defaults; 0: every layer global; None: the key is required). Their local layers'
# rope: gguf/rope.py SWA_ROPE.
SLIDING_WINDOW_DEFAULT: dict[str, int | None] = {"gemma2": 4096, "gemma3": 0, "olmo2": 0, "gpt-oss": None}

# Rotary layouts as in llama.cpp: NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama's converter permutes
# Q/K rows for it); NEOX rotates the two halves (x[i], x[i + d/2]).
ROPE_NORM = 0
ROPE_NEOX = 2
ROPE_NONE = -1  # no rotary embedding (GPT-2: learned absolute position embeddings)
ROPE_NORM_ARCHS = ("llama", "granite", "smollm3")  # llama.cpp's LLAMA_ROPE_TYPE_NORM; the others NEOX
# SmolLM3: every 4th layer (il + 1) % 4 == 0 has no rotary embedding (llama.cpp's n_no_rope_layer_step, a
# constant there: no key sets it)
NO_ROPE_LAYER_STEP = {"smollm3": 4}


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
    pooling: str = "mean"  # how an embedding pools the final hidden states (engine/pooling.py POOLABLE)
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
    # LFM2: layers marked True are short convolutions instead of attention, over the last conv_l_cache
    # tokens; each sequence then carries a recurrent state beside its KV blocks (engine/conv_state.py)
    conv_layers: list[bool] = field(default_factory=list)
    conv_l_cache: int = 0

    @property
    def recurrent(self) -> bool:
        """A sequence's state is more than its KV blocks (no prefix-cache hits, no speculative rollback)."""
        return any(self.conv_layers)

    @property
    def n_kv_layers(self) -> int:
        """Layers with K/V in the cache: all but the short-conv ones, in order (the KV cache's layers)."""
        return self.n_layers - sum(self.conv_layers)
    moe_gating: str = "softmax"  # MOE_GATING
    # gpt-oss: each head's learned logit in its softmax's denominator (blk.N.attn_sinks.weight [H])
    attn_sinks: bool = False

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
        if self.longrope is not None:
            self.rope = self.rope_swa = self.longrope.for_context(n_ctx)


# The CUDA attention kernel holds a query head in shared memory of this size (cuda/config.py MAX_HEAD_DIM;
# the CPU kernels have no limit): one limit for both keeps a file loadable on either backend.
MAX_HEAD_DIM = 512
# {arch}.pooling_type, llama.cpp's enum llama_pooling_type. NONE (per-token vectors) is what a plain
# language model's file says, or nothing: its one-vector embedding is the mean here. Generation ignores the
# key, so a value this table lacks loads and only embeddings refuse it.
POOLING_TYPES = {0: "mean", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# A context of one position leaves no room to generate after a single prompt token.
MIN_CONTEXT_LENGTH = 2


def _head_count_kv(g: GGUFFile, p: str, n_heads: int, n_layers: int) -> int:
    """head_count_kv: a scalar, or a per-layer array (some converters write one) whose entries must be equal,
    since every layer shares one KV cache shape here."""
    key = p + "attention.head_count_kv"
    value = g.get(key, n_heads)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        if len(value) != n_layers or len(set(value.tolist())) != 1:
            raise GGUFError(
                f"{g.path}: metadata {key} is a per-layer array {value.tolist()[:8]} of {len(value)} "
                f"entries: supported only with {n_layers} equal entries"
            )
        value = int(value[0])
    if not is_int(value):
        raise GGUFError(f"{g.path}: metadata {key} must be an integer, got {describe(value)}")
    return check_int_range(g, key, int(value), 1, n_heads, f"{p}attention.head_count = {n_heads}")


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    """The hyper-parameters, each read with its type and range checked (metadata.py); shapes that depend
    on several keys and on the tensors are checked by validation.validate_model."""
    arch = g.architecture
    if arch in KNOWN_UNSUPPORTED:
        raise UnsupportedArchitectureError(
            f"{g.path}: architecture {arch!r} is not implemented (it needs {KNOWN_UNSUPPORTED[arch]}; "
            f"supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedArchitectureError(
            f"{g.path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    p = f"{arch}."
    # Every layer has tensors of its own, so the file's tensor count bounds the layers; every width is
    # the length of some tensor's rows, so the file size bounds it.
    n_tensors, size = len(g.tensors), g.file_size
    n_layers = get_int(
        g, p + "block_count", lo=1, hi=max(1, n_tensors), why=f"{n_tensors} tensors in the file"
    )
    n_embd = get_int(g, p + "embedding_length", lo=1, hi=size, why="bounded by the file size")
    n_heads = get_int(g, p + "attention.head_count", lo=1, hi=size, why="bounded by the file size")
    if arch == "lfm2":  # a per-layer array whose zeros mark the short-conv layers
        n_kv_heads, conv_layers = lfm2_head_counts(g, n_heads, n_layers)
    else:
        n_kv_heads, conv_layers = _head_count_kv(g, p, n_heads, n_layers), [False] * n_layers
    if n_heads % n_kv_heads:
        raise GGUFError(
            f"{g.path}: {n_heads} attention heads are not a multiple of {n_kv_heads} KV heads "
            f"({p}attention.head_count={n_heads}, {p}attention.head_count_kv={n_kv_heads})"
        )
    default_head = n_embd // n_heads
    if p + "attention.key_length" not in g.metadata and not 1 <= default_head <= MAX_HEAD_DIM:
        raise GGUFError(
            f"{g.path}: head size {p}embedding_length / {p}attention.head_count = {n_embd} / {n_heads} "
            f"= {default_head} is out of range: must be 1..{MAX_HEAD_DIM}"
        )
    head_dim = get_int(g, p + "attention.key_length", default_head, lo=1, hi=MAX_HEAD_DIM)
    head_dim_v = get_int(g, p + "attention.value_length", head_dim, lo=1, hi=MAX_HEAD_DIM)
    rope_key = p + "rope.dimension_count"
    rope_dim = get_int(g, rope_key, head_dim, hi=2**64)  # the range check below names the head size
    if not (2 <= rope_dim <= head_dim and rope_dim % 2 == 0):
        raise GGUFError(
            f"{g.path}: metadata {rope_key} = {rope_dim}{'' if rope_key in g.metadata else ' (its default)'} "
            f"must be even, at least 2 and at most the head size {head_dim} (the rotary embedding rotates "
            "pairs of a head's dims)"
        )
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else 0
    if "token_embd.weight" in g.tensors:
        n_vocab = g.tensors["token_embd.weight"].shape[0]
        if isinstance(tokens, list) and len(tokens) != n_vocab:
            raise GGUFError(
                f"{g.path}: tensor 'token_embd.weight' has {n_vocab} rows but the vocabulary has "
                f"{len(tokens)} tokens"
            )
    rope_type = {"gpt2": ROPE_NONE}.get(arch, ROPE_NORM if arch in ROPE_NORM_ARCHS else ROPE_NEOX)
    n_ctx_train = get_int(g, p + "context_length", 2048, lo=MIN_CONTEXT_LENGTH, hi=INT32_MAX)
    sliding_window = 0
    if arch in SLIDING_WINDOW_DEFAULT:
        window_key, window_default = p + "attention.sliding_window", SLIDING_WINDOW_DEFAULT[arch]
        default_kw = {} if window_default is None else {"default": window_default}
        sliding_window = get_int(g, window_key, lo=0, hi=INT32_MAX, **default_kw)
    neox = rope_type == ROPE_NEOX
    rope, rope_swa = rope_from_gguf(g, arch, rope_dim, neox, n_ctx_train, sliding_window > 0)
    cfg = ModelConfig(
        arch=arch,
        name=get_str(g, "general.name", g.path.stem),
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=_dense_width(g, arch, size),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        rms_eps=get_float(g, p + "attention.layer_norm_rms_epsilon", 1e-5, lo=0.0, hi=1.0, lo_open=True),
        rope=rope,
        rope_swa=rope_swa,
        rope_dim=rope_dim,
        rope_type=rope_type,
        attn_scale=1.0 / math.sqrt(head_dim),
        swa_layers=[False] * n_layers,
        qkv_fused=[f"blk.{il}.attn_qkv.weight" in g.tensors for il in range(n_layers)],
        pooling=POOLING_TYPES.get(pooling_type := get_int(g, p + "pooling_type", 0), f"type {pooling_type}"),
        conv_layers=conv_layers,
    )
    cfg.sliding_window = sliding_window
    if arch in MOE_NORM_WEIGHTS:
        read_experts(g, cfg)
    if arch in ARCH_READERS:
        ARCH_READERS[arch](g, cfg)
    if arch in NO_ROPE_LAYER_STEP:
        step = NO_ROPE_LAYER_STEP[arch]
        cfg.no_rope_layers = [(il + 1) % step == 0 for il in range(n_layers)]
    return cfg


def _dense_width(g: GGUFFile, arch: str, size: int) -> int:
    """{arch}.feed_forward_length: required, except for gpt-oss, whose graph has no dense FFN (llama.cpp
    reads the key as optional; here its experts' width stands in)."""
    key = arch + ".feed_forward_length"
    if arch == "gpt-oss" and key not in g.metadata:
        return get_int(g, arch + ".expert_feed_forward_length", lo=1, hi=size, why="bounded by the file size")
    return get_int(g, key, lo=1, hi=size, why="bounded by the file size")
