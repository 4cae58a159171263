"""Model hyper-parameters from GGUF metadata, per architecture (keys as llama.cpp's converters write them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgellm.gguf.lfm2 import lfm2_head_counts, read_lfm2
from edgellm.gguf.metadata import INT32_MAX, check_int_range, describe, get_float, get_int, get_str, is_int
from edgellm.gguf.reader import GGUFError, GGUFFile
from edgellm.gguf.rope import LongRope, RopeParams, longrope_from_gguf, rope_from_gguf

SUPPORTED_ARCHS = (
    "llama", "gemma2", "gemma3", "granite", "olmo2", "olmoe", "qwen2", "qwen2moe", "qwen3", "qwen3moe",
    "starcoder2", "gpt2", "phi3", "smollm3", "lfm2", "gpt-oss",
)  # fmt: skip
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
        _experts(g, cfg)
    if arch in ("qwen2", "qwen2moe"):
        cfg.qkv_bias = True
    elif arch in ("qwen3", "qwen3moe"):
        cfg.qk_norm = True
    elif arch == "olmoe":
        cfg.qk_norm_full = True  # Q and K normed over the whole projection, after the usual pre-norm
    elif arch == "gemma3":
        cfg.qk_norm = True
        cfg.post_norms = True
        cfg.activation = "gelu"
        cfg.embd_scale = math.sqrt(n_embd)
        if cfg.sliding_window > 0:  # else every layer is global, as in llama.cpp
            cfg.swa_layers = swa_pattern(g, p + "attention.sliding_window_pattern", n_layers, 6)
        cfg.final_logit_softcap = get_float(g, p + "final_logit_softcapping", 0.0, lo=0.0)
        # Gemma 3 27B scales by the model width per head; the others by the head size (llama.cpp).
        if n_layers == 62:
            cfg.attn_scale = 1.0 / math.sqrt(n_embd / n_heads)
    elif arch == "gemma2":
        _gemma2(g, cfg)
    elif arch == "granite":
        _granite(g, cfg)
    elif arch == "olmo2":
        _olmo2(g, cfg)
    elif arch in LAYER_NORM_ARCHS:
        _layer_norm_arch(g, cfg)
    elif arch == "phi3":
        _phi3(g, cfg)
    elif arch == "lfm2":
        read_lfm2(g, cfg)
    elif arch == "gpt-oss":
        _gpt_oss(g, cfg)
    if arch in NO_ROPE_LAYER_STEP:
        step = NO_ROPE_LAYER_STEP[arch]
        cfg.no_rope_layers = [(il + 1) % step == 0 for il in range(n_layers)]
    return cfg


def _layer_norm_arch(g: GGUFFile, cfg: ModelConfig) -> None:
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


def _phi3(g: GGUFFile, cfg: ModelConfig) -> None:
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

def _experts(g: GGUFFile, cfg: ModelConfig) -> None:
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


def _dense_width(g: GGUFFile, arch: str, size: int) -> int:
    """{arch}.feed_forward_length: required, except for gpt-oss, whose graph has no dense FFN (llama.cpp
    reads the key as optional; here its experts' width stands in)."""
    key = arch + ".feed_forward_length"
    if arch == "gpt-oss" and key not in g.metadata:
        return get_int(g, arch + ".expert_feed_forward_length", lo=1, hi=size, why="bounded by the file size")
    return get_int(g, key, lo=1, hi=size, why="bounded by the file size")


def _gpt_oss(g: GGUFFile, cfg: ModelConfig) -> None:
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


def _gemma2(g: GGUFFile, cfg: ModelConfig) -> None:
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


def _olmo2(g: GGUFFile, cfg: ModelConfig) -> None:
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


def _granite(g: GGUFFile, cfg: ModelConfig) -> None:
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
