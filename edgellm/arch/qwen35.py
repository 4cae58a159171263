"""Qwen 3.5 / 3.6 dense (0.8B .. 27B): Gated DeltaNet linear attention in most layers, gated full attention
in every full_attention_interval-th one, as llama.cpp's llama_model_qwen35 (src/models/qwen35.cpp) runs it.

x = embed(tokens)                                                    # [T, n_embd]
for each layer:
    h = rmsnorm(x) * attn_norm
    DeltaNet layer (il + 1) % full_attention_interval != 0:
        x += DeltaNet(h)                                             # arch/deltanet.py
    attention layer:
        q | gate = Wq h                                              # per head [d | d]: [T, H, 2d]
        q, k = rmsnorm_heads(q) * attn_q_norm, rmsnorm_heads(Wk h) * attn_k_norm
        q, k = imrope(q), imrope(k)                                  # the first n_rot dims, halves rotated
        x += Wo (attention(q, k, Wv h) * sigmoid(gate))             # [T, H*d] gated per element
    x += W_down @ (silu(W_gate h) * (W_up h))      with h = rmsnorm(x) * post_attention_norm
logits = W_out @ (rmsnorm(x) * output_norm)        # tied to token_embd without output.weight

The rope is llama.cpp's interleaved multi-section rope (IMROPE) with text positions: the t, h and w
sections get the token's position, the fourth section position 0. Rotated pair i belongs to section
sector = i % sum(sections) by sector % 3 (t, h, w) while sector < 3 * that section's size, else to the
fourth; a pair of the fourth section is not rotated (its frequency factor is infinite here, its angle 0).

The KV cache holds the attention layers only (cfg.n_kv_layers; kv_index maps a layer to its place there);
the DeltaNet layers keep a per-sequence state (cfg.conv_layers marks them; engine/conv_state.py). A file's
multi-token-prediction layers (the last nextn_predict_layers) are skipped, as llama.cpp's main graph does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import FeedForwardWeights, ForwardBatch, TensorSource, pre_norm
from edgellm.arch.deltanet import (
    DELTANET_KEYS,
    DELTANET_TENSORS,
    check_conv_types,
    deltanet_block,
    deltanet_shapes,
    load_deltanet,
    read_deltanet,
    state_size,
)
from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import GLOBAL_TENSORS, ArchSpec, Shapes
from edgellm.gguf.metadata import INT32_MAX, describe, get_int
from edgellm.gguf.model_config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

STATE_BACKENDS = ("cpu",)  # the DeltaNet recurrence runs on host arrays
ATTENTION_TENSORS = frozenset(
    {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
     "attn_k_norm.weight"}
)  # fmt: skip
LAYER_TENSORS = frozenset(
    {"attn_norm.weight", "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
)


def _int_array(g: GGUFFile, key: str, n_max: int) -> list[int] | None:
    """An integer (or bool) array key of at most n_max entries (llama.cpp's get_key_or_arr); None: absent."""
    value = g.get(key, None)
    if value is None:
        return None
    if not (isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "biu"):
        raise GGUFError(f"{g.path}: metadata {key} must be an array of integers, got {describe(value)}")
    if len(value) > n_max:
        raise GGUFError(f"{g.path}: metadata {key} has {len(value)} entries, at most {n_max} allowed")
    return [int(v) for v in value]


def skip_mtp_layers(g: GGUFFile, cfg: ModelConfig) -> None:
    """The last nextn_predict_layers layers are multi-token-prediction heads, which llama.cpp's main graph
    never runs (it skips their tensors unless asked for MTP drafting): the trunk is the layers before."""
    n_all = cfg.n_layers
    nextn = get_int(g, cfg.arch + ".nextn_predict_layers", 0, lo=0, hi=n_all - 1)
    if nextn:
        cfg.n_layers, cfg.n_nextn_layers = n_all - nextn, nextn
        cfg.swa_layers, cfg.qkv_fused = cfg.swa_layers[: cfg.n_layers], cfg.qkv_fused[: cfg.n_layers]


def read_hybrid_layers(g: GGUFFile, cfg: ModelConfig) -> None:
    """Which layers are DeltaNet (recurrent): attention.recurrent_layers when the file has it (one flag per
    layer, MTP heads included), else every layer but each full_attention_interval-th (default 4), as
    llama.cpp's load_arch_hparams."""
    p, n_all = cfg.arch + ".", cfg.n_layers + cfg.n_nextn_layers
    flags = _int_array(g, p + "attention.recurrent_layers", n_all)
    if flags is not None:
        if len(flags) != n_all:
            raise GGUFError(
                f"{g.path}: metadata {p}attention.recurrent_layers has {len(flags)} flags for {n_all} layers"
            )
        cfg.conv_layers = [bool(f) for f in flags[: cfg.n_layers]]
    else:
        interval = get_int(g, p + "full_attention_interval", 4, lo=1, hi=INT32_MAX)
        cfg.conv_layers = [(il + 1) % interval != 0 for il in range(cfg.n_layers)]


def imrope_factors(g: GGUFFile, cfg: ModelConfig) -> None:
    """rope.dimension_sections (required, up to 4) -> cfg.rope's frequency factors: inf for the pairs of
    the fourth section (position 0 for text: not rotated), 1 for the others (module doc)."""
    key = cfg.arch + ".rope.dimension_sections"
    sections = _int_array(g, key, 4)
    if sections is None:
        raise GGUFError(f"{g.path}: missing metadata {key} (the multi-section rope's sizes)")
    sections = (sections + [0, 0, 0, 0])[:4]
    if min(sections) < 0 or max(sections[:3]) <= 0:
        raise GGUFError(f"{g.path}: metadata {key} = {sections}: a t, h or w section must be positive")
    n_sect, half = sum(sections), cfg.rope_dim // 2
    if n_sect > cfg.head_dim:  # ggml's GGML_ASSERT(sect_dims <= ne0)
        raise GGUFError(f"{g.path}: metadata {key} = {sections} spans more than the head size {cfg.head_dim}")
    factors = []
    for i in range(half):
        sector = i % n_sect
        kind = sector % 3
        factors.append(1.0 if sector < 3 * sections[kind] else float("inf"))
    if any(f != 1.0 for f in factors):
        if cfg.rope.freq_factors:
            raise GGUFError(f"{g.path}: rope frequency factors with a multi-section rope are not implemented")
        cfg.rope = cfg.rope_swa = dataclasses.replace(cfg.rope, freq_factors=tuple(factors))


def read_qwen35(g: GGUFFile, cfg: ModelConfig) -> None:
    if cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: {cfg.arch} key / value head sizes {cfg.head_dim} / {cfg.head_dim_v} must be equal "
            "(as llama.cpp's qwen35 asserts)"
        )
    read_deltanet(g, cfg)
    skip_mtp_layers(g, cfg)
    read_hybrid_layers(g, cfg)
    imrope_factors(g, cfg)


def attention_layer_shapes(cfg: ModelConfig) -> Shapes:
    """A gated attention layer's own tensors: Q holds [q | gate] per head."""
    e, H, Hkv, d = cfg.n_embd, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    return {"attn_q.weight": (2 * H * d, e), "attn_k.weight": (Hkv * d, e), "attn_v.weight": (Hkv * d, e),
            "attn_output.weight": (e, H * d), "attn_q_norm.weight": (d,),
            "attn_k_norm.weight": (d,)}  # fmt: skip


def hybrid_shapes(cfg: ModelConfig, ffn: Shapes) -> Shapes:
    """Every tensor of a Qwen 3.5-family file -> numpy-order shape, each layer its kind's mixer and `ffn`
    (output.weight: optional, tied)."""
    e = cfg.n_embd
    shapes: Shapes = {"token_embd.weight": (cfg.n_vocab, e)}
    for il in range(cfg.n_layers):
        layer = deltanet_shapes(cfg) if cfg.conv_layers[il] else attention_layer_shapes(cfg)
        layer |= {"attn_norm.weight": (e,), "post_attention_norm.weight": (e,)} | ffn
        shapes.update({f"blk.{il}.{name}": shape for name, shape in layer.items()})
    shapes["output_norm.weight"] = (e,)
    return shapes


def qwen35_shapes(cfg: ModelConfig) -> Shapes:
    e, f = cfg.n_embd, cfg.n_ff
    return hybrid_shapes(cfg, {"ffn_gate.weight": (f, e), "ffn_up.weight": (f, e), "ffn_down.weight": (e, f)})


def hybrid_layer_check(shapes: Callable[[ModelConfig], Shapes]) -> Callable[[GGUFFile, ModelConfig], None]:
    """The spec's check: each layer carries only its own kind's tensors as `shapes` lists them (the
    allowlist is per architecture, not per layer), and the conv kernels are F32."""

    def check(g: GGUFFile, cfg: ModelConfig) -> None:
        expected = shapes(cfg)
        for name in g.tensors:
            if name.startswith("blk.") and int(name.split(".")[1]) >= cfg.n_layers:
                continue  # an MTP head's (skip_mtp_layers; understood.py checks their names)
            if name.startswith("blk.") and name not in expected:
                kind = "DeltaNet" if cfg.conv_layers[int(name.split(".")[1])] else "full-attention"
                raise GGUFError(
                    f"{g.path}: tensor {name!r} is not one a {kind} layer of {cfg.arch} has (every "
                    "full_attention_interval-th layer is full attention, or as attention.recurrent_layers "
                    "says)"
                )
        check_conv_types(g)

    return check


# A multi-token-prediction head's own tensors (beside a full-attention layer's), which no pass here reads
MTP_TENSORS = frozenset(
    f"nextn.{n}.weight"
    for n in ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head_head", "shared_head_norm")
)
HYBRID_KEYS = DELTANET_KEYS | {
    "nextn_predict_layers",
    "full_attention_interval",
    "attention.recurrent_layers",
    "rope.dimension_sections",
}
SPEC = ArchSpec(
    name="qwen35",
    block_tensors=LAYER_TENSORS | ATTENTION_TENSORS | DELTANET_TENSORS | MTP_TENSORS,
    keys=HYBRID_KEYS,
    global_tensors=GLOBAL_TENSORS,
    read=read_qwen35,
    tensor_shapes=qwen35_shapes,
    check=hybrid_layer_check(qwen35_shapes),
)


@dataclass
class GatedAttentionWeights:
    norm: Any  # [n_embd]
    wqkv: Any  # [2*H*d + 2*Hkv*d, n_embd]: q|gate interleaved per head, then K, then V
    wo: Any  # [n_embd, H*d]
    q_norm: Any  # [d]
    k_norm: Any  # [d]

    @property
    def matrices(self) -> list[Any]:
        return [self.wqkv, self.wo]


def load_gated_attention(be: Backend, src: TensorSource, cfg: ModelConfig, il: int) -> GatedAttentionWeights:
    p, shapes = f"blk.{il}.", attention_layer_shapes(cfg)
    qkv = [src.get(p + f"attn_{n}.weight", shapes[f"attn_{n}.weight"]) for n in "qkv"]
    return GatedAttentionWeights(
        norm=be.load_vector(src.get(p + "attn_norm.weight", (cfg.n_embd,))),
        wqkv=be.load_matrix(qkv),
        wo=be.load_matrix([src.get(p + "attn_output.weight", shapes["attn_output.weight"])]),
        q_norm=be.load_vector(src.get(p + "attn_q_norm.weight", (cfg.head_dim,))),
        k_norm=be.load_vector(src.get(p + "attn_k_norm.weight", (cfg.head_dim,))),
    )


def gated_attention_block(
    be: Backend, cfg: ModelConfig, w: GatedAttentionWeights, x: Any, batch: ForwardBatch, kv: Any,
    kv_layer: int, inp: Any,
) -> None:  # fmt: skip
    """x += Wo (attention(...) * sigmoid(gate)) for every token (in place). x: [T, n_embd]."""
    T, H, Hkv, d = batch.n_tokens, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    h = pre_norm(be, cfg, w.norm, x, T)
    qkv = be.empty((T, 2 * H * d + 2 * Hkv * d))
    be.matmul(h, w.wqkv, qkv)
    qg = qkv[:, : 2 * H * d].reshape(T, H, 2, d)  # per head [q | gate]
    q = be.contiguous(qg[:, :, 0])  # [T, H, d]
    gate = be.to_host(be.contiguous(qg[:, :, 1])).reshape(T, H * d)
    k = be.contiguous(qkv[:, 2 * H * d : (2 * H + Hkv) * d].reshape(T, Hkv, d))
    v = be.contiguous(qkv[:, (2 * H + Hkv) * d :].reshape(T, Hkv, d))
    be.rmsnorm_heads(q, w.q_norm, cfg.rms_eps)
    be.rmsnorm_heads(k, w.k_norm, cfg.rms_eps)
    be.rope(q, inp.positions, cfg.rope)
    be.rope(k, inp.positions, cfg.rope)
    be.write_kv(kv, kv_layer, k, v, inp.slots)
    attn = be.empty((T, H, d))
    where = (inp.block_tables, inp.seq_index, inp.positions)
    be.attention(q, kv, kv_layer, *where, 0, cfg.attn_scale, attn, 0.0, None)
    f32 = np.float32
    gated = be.to_host(attn).reshape(T, H * d) * (f32(1) / (f32(1) + np.exp(-gate)))
    o = be.empty((T, cfg.n_embd))
    be.matmul(be.from_host(np.ascontiguousarray(gated, f32)), w.wo, o)
    be.add(x, o)


class Qwen35Model(LlamaModel):
    """LlamaModel's embedding and output; DeltaNet or gated attention layers, each with the dense FFN
    (load_ffn / ffn_block: the experts for qwen35moe)."""

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        if be.name not in STATE_BACKENDS:
            raise UnsupportedArchitectureError(
                f"{gguf.path}: architecture {cfg.arch!r} (Gated DeltaNet layers with a per-sequence state) "
                f"is not implemented on the {be.name} backend (only on: {', '.join(STATE_BACKENDS)})"
            )
        rec = [il for il, r in enumerate(cfg.conv_layers) if r]
        self.state_index = {il: i for i, il in enumerate(rec)}  # DeltaNet layer -> its row of the state
        self.kv_index = {il: i for i, il in enumerate(il for il, r in enumerate(cfg.conv_layers) if not r)}
        super().__init__(cfg, gguf, be, progress)

    def load_ffn(self, src: TensorSource, il: int) -> Any:
        p, e, f, be = f"blk.{il}.", self.cfg.n_embd, self.cfg.n_ff, self.be
        gate_up = [src.get(p + "ffn_gate.weight", (f, e)), src.get(p + "ffn_up.weight", (f, e))]
        return FeedForwardWeights(
            norm=be.load_vector(src.get(p + "post_attention_norm.weight", (e,))),
            w_gate_up=be.load_matrix(gate_up),
            w_down=be.load_matrix([src.get(p + "ffn_down.weight", (e, f))]),
        )

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        if self.cfg.conv_layers[il]:
            mixer = load_deltanet(self.be, src, self.cfg, il)
        else:
            mixer = load_gated_attention(self.be, src, self.cfg, il)
        return mixer, self.load_ffn(src, il)

    def _layers(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        state = batch.conv_state
        want = (batch.block_tables.shape[0], len(self.state_index), state_size(cfg))
        if state is None or state.shape != want or state.dtype != np.float32:
            got = None if state is None else (state.shape, state.dtype)
            raise GGUFError(f"{cfg.arch}: the batch's state is {got}, expected {want} float32 (ModelRunner)")
        inp = be.step_inputs(batch)
        x = self.embed(batch, inp)  # [T, n_embd]
        for il, (mixer, ffn_w) in enumerate(self.layers):
            if cfg.conv_layers[il]:
                layer_state = np.ascontiguousarray(state[:, self.state_index[il]])
                deltanet_block(be, cfg, mixer, x, batch, layer_state)
                state[:, self.state_index[il]] = layer_state
            else:
                gated_attention_block(be, cfg, mixer, x, batch, kv, self.kv_index[il], inp)
            self.ffn_block(be, cfg, ffn_w, x, batch.n_tokens)
        return x, inp


MODEL = Qwen35Model
