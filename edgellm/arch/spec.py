"""What an architecture file declares beside its forward pass: an `ArchSpec`, the facts gguf/ needs to read,
check and refuse a file of that architecture (as llama.cpp's src/llama-arch.cpp tables and its
llama_model_<arch> load_hparams / load_tensors hold them), and the pieces several architectures share.

gguf/config.py reads the spec's keys and flags into a ModelConfig, gguf/understood.py refuses any tensor or
key the spec does not list, gguf/validation.py checks every tensor the spec's `tensor_shapes` names. This
module and the specs import no backend: a front-end reads a file's config without loading any kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from edgellm.gguf.metadata import INT32_MAX, get_int
from edgellm.gguf.model_config import MAX_HEAD_DIM, ROPE_NEOX, ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile

Shapes = dict[str, tuple[int, ...]]  # tensor name -> numpy-order shape

# ---- tensor names several architectures share (the per-layer part after "blk.N.", as llama.cpp's
# src/models/<arch>.cpp creates them) ---------------------------------------------------------------------
LLAMA_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)
# Optional Q/K/V biases: llama.cpp's create_tensor_qkv reads them for every architecture (required where
# a spec sets the qkv_bias flag); output-projection and FFN biases: llama and Granite only.
QKV_BIASES = frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"})
LLAMA_BIASES = frozenset({"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"})
QK_NORMS = frozenset({"attn_q_norm.weight", "attn_k_norm.weight"})
POST_NORMS = frozenset({"post_attention_norm.weight", "post_ffw_norm.weight"})
# A mixture-of-experts FFN in place of the dense one: the router and the experts' 3-D matrices
EXPERT_TENSORS = frozenset(
    {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
)
DENSE_FFN = frozenset({"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
# llama's layer with the experts in place of the dense FFN (the Qwen MoEs, OLMoE, gpt-oss)
MOE_BLOCK = (LLAMA_BLOCK - DENSE_FFN) | QKV_BIASES | EXPERT_TENSORS
# Q|K|V as one matrix (and its bias), which llama.cpp's create_tensor_qkv reads in place of the three, per
# layer, for the specs with fused_qkv (validation.check_qkv_forms refuses a layer with both forms)
FUSED_QKV = frozenset({"attn_qkv.weight", "attn_qkv.bias"})
GLOBAL_TENSORS = frozenset({"token_embd.weight", "output_norm.weight", "output.weight"})

# ---- {arch}.* keys several architectures share (the suffix after "{arch}.") -----------------------------
EXPERT_KEYS = frozenset({"expert_count", "expert_used_count"})  # Experts.read
EXPERT_GROUP_KEYS = frozenset({"expert_group_count", "expert_group_used_count"})  # Experts.groups
SLIDING_WINDOW_KEYS = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})

MAX_EXPERTS = 1 << 16  # a bound for the metadata check: real files have up to a few hundred


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts FFN as llama.cpp's build_moe_ffn runs it for the architecture (arch/moe.py)."""

    renormalise: bool  # the top-k router probabilities divided by their sum (llama.cpp's norm_w)
    # How the router's logits become the selected experts' weights (llama.cpp's expert_gating_func):
    # "softmax" over all experts, then the top k; "softmax_weight": the top k logits, then a softmax over
    # those k (gpt-oss).
    gating: str = "softmax"
    # {arch}.expert_feed_forward_length: None: not read (the experts are feed_forward_length wide); False:
    # optional (default feed_forward_length / expert_used_count, as llama.cpp); True: required
    width_key: bool | None = None
    shared: bool = False  # a shared expert, {arch}.expert_shared_feed_forward_length wide (Qwen 2 MoE)
    optional: bool = False  # a dense model when expert_count is missing or 0 (llama; Mixtral has experts)
    # {arch}.expert_group_count / expert_group_used_count are read (DeepSeek V3's group-limited choice)
    groups: bool = False

    def read(self, g: GGUFFile, cfg: ModelConfig) -> None:
        """The experts' counts and width as llama.cpp reads them: {arch}.expert_count (required, or absent / 0
        for a dense model where `self.optional`), expert_used_count in 1..expert_count, and the experts' FFN
        width (Experts.width_key; else feed_forward_length); a shared expert
        {arch}.expert_shared_feed_forward_length wide (default feed_forward_length)."""
        p = cfg.arch + "."
        if self.optional:  # a dense model (llama.cpp's HARMLESS_AT zeros for the other keys)
            n_expert = get_int(g, p + "expert_count", 0, hi=MAX_EXPERTS)
            if n_expert == 0:
                if get_int(g, p + "expert_used_count", 0) != 0:
                    raise GGUFError(
                        f"{g.path}: metadata {p}expert_used_count is set but {p}expert_count is 0"
                    )
                return
        else:
            n_expert = get_int(g, p + "expert_count", lo=1, hi=MAX_EXPERTS)
        cfg.n_expert = n_expert
        cfg.n_expert_used = get_int(g, p + "expert_used_count", lo=1, hi=n_expert, why=f"{n_expert} experts")
        cfg.n_ff_exp = cfg.n_ff
        if self.width_key is not None:
            kw = {} if self.width_key else {"default": max(1, cfg.n_ff // cfg.n_expert_used)}
            cfg.n_ff_exp = get_int(g, p + "expert_feed_forward_length", lo=1, hi=g.file_size, **kw)
        if self.shared:
            cfg.n_ff_shexp = get_int(
                g, p + "expert_shared_feed_forward_length", cfg.n_ff, lo=1, hi=g.file_size
            )
        cfg.moe_norm_weights = self.renormalise
        cfg.moe_gating = self.gating
        if self.groups:
            groups = get_int(g, p + "expert_group_count", 0, lo=0, hi=n_expert)
            if groups > 1 and n_expert % groups:
                raise GGUFError(f"{g.path}: {n_expert} experts do not split into {groups} groups")
            cfg.n_expert_groups = groups
            used_hi = max(groups, 1)
            cfg.n_group_used = get_int(g, p + "expert_group_used_count", used_hi, lo=0, hi=used_hi)
            if groups > 1 and cfg.n_group_used * (n_expert // groups) < cfg.n_expert_used:
                raise GGUFError(
                    f"{g.path}: {cfg.n_group_used} of {groups} expert groups hold fewer than the "
                    f"{cfg.n_expert_used} experts a token uses"
                )


def llama_family_shapes(
    cfg: ModelConfig,
    adjust_layer: Callable[[ModelConfig, Shapes], Shapes] | None = None,
    output_required: bool = False,
) -> Shapes:
    """Every tensor arch/common.py and arch/llama.py read for the flags of `cfg` -> its numpy-order shape.
    output.weight is optional (tied embeddings) and not listed unless `output_required` (llama.cpp requires
    it of some architectures); `adjust_layer` rewrites each layer's table (gpt-oss's names)."""
    e, f, V = cfg.n_embd, cfg.n_ff, cfg.n_vocab
    H, Hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v
    shapes: Shapes = {"token_embd.weight": (V, e)}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        layer = {
            "attn_norm.weight": (e,),
            "attn_q.weight": (H * d, e),
            "attn_k.weight": (Hkv * d, e),
            "attn_v.weight": (Hkv * dv, e),
            "attn_output.weight": (e, H * dv),
            "ffn_norm.weight": (e,),
            "ffn_gate.weight": (f, e),
            "ffn_up.weight": (f, e),
            "ffn_down.weight": (e, f),
        }
        if cfg.qkv_fused[il]:  # Q|K|V biases, required for Qwen 2: check_qkv_forms
            del layer["attn_q.weight"], layer["attn_k.weight"], layer["attn_v.weight"]
            layer["attn_qkv.weight"] = ((H + Hkv) * d + Hkv * dv, e)
        if cfg.gate_up_fused:
            del layer["ffn_gate.weight"]
            layer["ffn_up.weight"] = (2 * f, e)
        if cfg.n_expert:  # the experts in place of the dense FFN (arch/moe.py)
            E, fe = cfg.n_expert, cfg.n_ff_exp
            for name in DENSE_FFN:
                layer.pop(name, None)
            layer.update(
                {
                    "ffn_gate_inp.weight": (E, e),
                    "ffn_gate_exps.weight": (E, fe, e),
                    "ffn_up_exps.weight": (E, fe, e),
                    "ffn_down_exps.weight": (E, e, fe),
                }
            )
        if cfg.n_ff_shexp:
            fs = cfg.n_ff_shexp
            layer.update(
                {
                    "ffn_gate_inp_shexp.weight": (e,),
                    "ffn_gate_shexp.weight": (fs, e),
                    "ffn_up_shexp.weight": (fs, e),
                    "ffn_down_shexp.weight": (e, fs),
                }
            )
        if not cfg.pre_norms:
            del layer["attn_norm.weight"], layer["ffn_norm.weight"]
        if cfg.qk_norm:
            layer.update({"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)})
        if cfg.qk_norm_full:
            layer.update({"attn_q_norm.weight": (H * d,), "attn_k_norm.weight": (Hkv * d,)})
        if cfg.post_norms:
            layer.update({"post_attention_norm.weight": (e,), "post_ffw_norm.weight": (e,)})
        if adjust_layer is not None:
            layer = adjust_layer(cfg, layer)
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes["output_norm.weight"] = (e,)
    if output_required:
        shapes["output.weight"] = (V, e)
    return shapes


@dataclass(frozen=True)
class ArchSpec:
    """One architecture's facts, declared by its file in edgellm/arch/ (module doc). Names of tensors and
    keys are as llama.cpp's converters write them; every reader gets the file and the ModelConfig being
    built."""

    name: str  # general.architecture
    # The per-layer tensors a file may hold (after "blk.N."): anything else is refused (gguf/understood.py)
    block_tensors: frozenset[str]
    # The {name}.* keys the architecture reads beyond those every architecture shares (understood.py
    # COMMON_KEYS, ROPE_KEYS)
    keys: frozenset[str] = frozenset()
    global_tensors: frozenset[str] = GLOBAL_TENSORS  # the tensors outside the layers a file may hold
    fused_qkv: bool = False  # a layer's Q|K|V may come as attn_qkv.weight (+ .bias): FUSED_QKV
    rope_type: int = ROPE_NEOX  # model_config.ROPE_*: llama.cpp's llama_model_rope_type
    rope_freq_factors: bool = False  # llama3's rope_freqs.weight is read (gguf/rope.py)
    # the rope.scaling.yarn_* keys (suffixes: "yarn_beta_fast", ...) the architecture reads (Mistral 3's
    # three, DeepSeek 2's log multiplier); the others are accepted only at llama.cpp's own values
    yarn_keys: tuple[str, ...] = ()
    # The largest head size (key_length, value_length) accepted: the CUDA attention kernel's bound, which
    # one limit for every backend keeps loadable anywhere; DeepSeek 2's latent K (576 in the released
    # files) passes it, on the CPU backend only (its attention sizes its scratch by the head)
    max_head_dim: int = MAX_HEAD_DIM
    # {name}.nextn_predict_layers is read: that many layers after the model's are multi-token prediction
    # layers, skipped (their tensors accepted, never read) as llama.cpp does unless asked to load them
    nextn_layers: bool = False
    # The sliding-window layers' rope where it differs from the global layers' (gguf/rope.py
    # rope_from_gguf): (the base without rope.freq_base_swa, None for rope.freq_base; whether the frequency
    # scaling applies); None: the local layers rotate as the global ones
    swa_rope: tuple[float | None, bool] | None = None
    # {name}.attention.sliding_window is read into cfg.sliding_window, with this default when missing (0:
    # every layer global; None: required); the reader sets which layers are local (swa_pattern)
    sliding_window: bool = False
    sliding_window_default: int | None = 0
    no_rope_layer_step: int = 0  # every n-th layer (il + 1) % n == 0 has no rope (llama.cpp's NoPE step)
    experts: Experts | None = None  # a mixture-of-experts FFN (Experts.read reads its keys)
    # {name}.feed_forward_length is required; False: optional, the experts' width stands in (gpt-oss has
    # no dense FFN)
    dense_ffn_key: bool = True
    flags: Mapping[str, Any] = field(default_factory=dict)  # ModelConfig fields the architecture sets
    # The keys and checks beyond the flags (run after them and Experts.read)
    read: Callable[[GGUFFile, ModelConfig], None] | None = None
    # (KV heads, per-layer short-conv flags) from head_count_kv when it is not one count for every layer
    # (LFM2); None: config.py's reading
    head_counts: Callable[[GGUFFile, int, int], tuple[int, list[bool]]] | None = None
    # Every tensor the model code reads -> its shape (gguf/validation.py checks each)
    tensor_shapes: Callable[[ModelConfig], Shapes] = llama_family_shapes
    check: Callable[[GGUFFile, ModelConfig], None] | None = None  # what the tables above cannot say
    # Per-layer tensors (after "blk.N.") of more than one allowed shape, which `check` checks instead of
    # validation's one shape per name (jina-bert-v2's ffn_up and its bias, with or without the gate in it)
    checked_shapes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.flags) - {f.name for f in fields(ModelConfig)}
        if unknown:  # a misspelt flag would set an attribute nothing reads
            raise TypeError(f"architecture {self.name!r}: flags {sorted(unknown)} are not ModelConfig fields")

    @property
    def layer_tensors(self) -> frozenset[str]:
        """The per-layer tensors a file may hold, the fused Q|K|V form included where it may have it."""
        return self.block_tensors | FUSED_QKV if self.fused_qkv else self.block_tensors


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
