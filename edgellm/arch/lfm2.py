"""LiquidAI's LFM2 (350M, 700M, 1.2B, 2.6B): short gated convolutions beside a few attention layers.

x = embed(tokens)                                                    # [T, n_embd]
for each layer:
    h = rmsnorm(x) * attn_norm
    short-conv layer (lfm2.attention.head_count_kv[il] == 0):
        b | c | u = W_in h                                           # [T, 3 * n_embd], in that order
        v = b * u                                                    # [T, n_embd]
        y_t = sum_k w[:, k] * v_{t - (L-1) + k},  k = 0..L-1         # causal depthwise conv, L = l_cache
        x += W_out (c * y)                                           # v_{<0}: the sequence's conv state
    attention layer:
        x += Wo @ attention(rope(qnorm(Wq h)), rope(knorm(Wk h)), Wv h)   # per-head Q/K norms, NEOX rope
    x += W_down @ (silu(W_gate h) * (W_up h))          with h = rmsnorm(x) * ffn_norm
logits = W_out @ (rmsnorm(x) * token_embd_norm)     # tied to token_embd without output.weight

The conv state of a sequence is its last L-1 rows of v in every conv layer (llama.cpp's recurrent memory
r_l): the engine keeps one per sequence (engine/conv_state.py) and hands the batch's rows in as
batch.conv_state, which the forward pass reads and advances in place. The KV cache holds the attention
layers only (cfg.n_kv_layers; kv_index maps a layer to its place there). The conv sums its L products in k
order in float32, as ggml's ssm_conv. CPU only: the conv runs on host arrays.

The file, as llama.cpp's llama_model_lfm2 reads it: `lfm2.attention.head_count_kv` is a per-layer array, 0
marking a short-conv layer and a positive count an attention layer; every attention layer has the same
count here, since every layer shares one KV cache shape. The final norm is stored as
`token_embd_norm.weight`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.arch.common import ForwardBatch, TensorSource, attention_block, load_feed_forward, pre_norm
from edgellm.arch.llama import LlamaModel
from edgellm.arch.spec import GLOBAL_TENSORS, LLAMA_BLOCK, QK_NORMS, ArchSpec, Shapes
from edgellm.gguf.metadata import INT32_MAX, check_int_range, describe, get_int, is_int
from edgellm.gguf.model_config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

# Backends whose arrays are host numpy arrays, which the conv below works on in place
CONV_BACKENDS = ("cpu",)
# The final norm: the converter's name for it (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2), not applied after
# the embedding
OUTPUT_NORM = "token_embd_norm.weight"
CONV_TENSOR = "shortconv.conv.weight"
# Only the conv kernel's F32 is read by llama.cpp's ssm_conv (its converter and quantizer keep it F32)
CONV_TYPES = (GGMLQuantizationType.F32,)


def lfm2_head_counts(g: GGUFFile, n_heads: int, n_layers: int) -> tuple[int, list[bool]]:
    """(KV heads of the attention layers, per-layer flags: True for a short-conv layer) from
    lfm2.attention.head_count_kv: an array of one count per layer, or a scalar (every layer attention)."""
    key = "lfm2.attention.head_count_kv"
    value = g.get(key, n_heads)
    if is_int(value):
        counts = [int(value)] * n_layers
    elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        if len(value) != n_layers:
            raise GGUFError(f"{g.path}: metadata {key} has {len(value)} entries for {n_layers} layers")
        counts = [int(v) for v in value]
    else:
        raise GGUFError(
            f"{g.path}: metadata {key} must be an integer or an array of them, got {describe(value)}"
        )
    attention = sorted({c for c in counts if c != 0})
    if len(attention) > 1:
        raise GGUFError(
            f"{g.path}: metadata {key} = {counts[:16]}: attention layers with different KV head counts "
            f"{attention} are not implemented (every layer shares one KV cache shape)"
        )
    n_kv = attention[0] if attention else n_heads
    check_int_range(g, key, n_kv, 1, n_heads, f"lfm2.attention.head_count = {n_heads}")
    return n_kv, [c == 0 for c in counts]


def read_lfm2(g: GGUFFile, cfg: ModelConfig) -> None:
    """The short-conv width (the layer kinds were set from head_count_kv: lfm2_head_counts)."""
    # llama.cpp requires the key; the state keeps l_cache - 1 past rows per conv layer
    cfg.conv_l_cache = get_int(g, "lfm2.shortconv.l_cache", lo=2, hi=min(INT32_MAX, g.file_size))
    if cfg.head_dim_v != cfg.head_dim or cfg.n_heads * cfg.head_dim != cfg.n_embd:
        raise GGUFError(
            f"{g.path}: lfm2 heads of {cfg.head_dim} (K) / {cfg.head_dim_v} (V) x {cfg.n_heads} must span "
            f"lfm2.embedding_length = {cfg.n_embd} (llama.cpp's LFM2 shapes)"
        )


def lfm2_shapes(cfg: ModelConfig) -> Shapes:
    """Every tensor arch/lfm2.py reads -> its numpy-order shape (output.weight: optional, tied)."""
    e, f, V, L = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.conv_l_cache
    kv, d = cfg.n_kv_heads * cfg.head_dim, cfg.head_dim
    shapes: Shapes = {"token_embd.weight": (V, e)}
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        if cfg.conv_layers[il]:
            layer = {"attn_norm.weight": (e,), "shortconv.in_proj.weight": (3 * e, e),
                     CONV_TENSOR: (e, L), "shortconv.out_proj.weight": (e, e)}  # fmt: skip
        else:
            layer = {"attn_norm.weight": (e,), "attn_q.weight": (e, e), "attn_k.weight": (kv, e),
                     "attn_v.weight": (kv, e), "attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,),
                     "attn_output.weight": (e, e)}  # fmt: skip
        layer |= {"ffn_norm.weight": (e,), "ffn_gate.weight": (f, e), "ffn_up.weight": (f, e),
                  "ffn_down.weight": (e, f)}  # fmt: skip
        shapes.update({p + name: shape for name, shape in layer.items()})
    shapes[OUTPUT_NORM] = (e,)
    return shapes


def check_lfm2_layers(g: GGUFFile, cfg: ModelConfig) -> None:
    """A layer carries only its own kind's tensors (the allowlist is per architecture, not per layer), and
    the conv kernels are F32 (the only type llama.cpp's ssm_conv reads)."""
    expected = lfm2_shapes(cfg)
    for name, t in g.tensors.items():
        if name.startswith("blk.") and name not in expected:
            kind = "short-conv" if cfg.conv_layers[int(name.split(".")[1])] else "attention"
            raise GGUFError(
                f"{g.path}: tensor {name!r} is not one a {kind} layer of lfm2 has (the layer kinds come from "
                "lfm2.attention.head_count_kv: 0 for a short-conv layer)"
            )
        if name.endswith(CONV_TENSOR) and t.qtype not in CONV_TYPES:
            raise GGUFError(
                f"{g.path}: tensor {name!r} is {GGMLQuantizationType(t.qtype).name}: lfm2's conv kernel is "
                "read as F32 only (as llama.cpp's ssm_conv)"
            )


# The short-conv layers' tensors (an attention layer has llama's with per-head Q/K norms)
SHORTCONV = frozenset({"shortconv.in_proj.weight", CONV_TENSOR, "shortconv.out_proj.weight"})
SPEC = ArchSpec(
    name="lfm2",
    # no biases: llama.cpp asserts none in its FFN and its graph adds none; check_lfm2_layers checks that
    # each layer has only its own kind's
    block_tensors=LLAMA_BLOCK | QK_NORMS | SHORTCONV,
    keys=frozenset({"shortconv.l_cache"}),
    global_tensors=GLOBAL_TENSORS - {"output_norm.weight"} | {OUTPUT_NORM},  # the final norm's name
    head_counts=lfm2_head_counts,
    flags={"qk_norm": True},
    read=read_lfm2,
    tensor_shapes=lfm2_shapes,
    check=check_lfm2_layers,
)


@dataclass
class ShortConvWeights:
    norm: Any  # [n_embd] the layer's pre-norm (attn_norm, llama.cpp's operator_norm)
    in_proj: Any  # [3 * n_embd, n_embd] -> B | C | x
    conv: np.ndarray  # [n_embd, L] float32: channel c's taps, oldest first
    out_proj: Any  # [n_embd, n_embd]

    @property
    def matrices(self) -> list[Any]:
        return [self.in_proj, self.out_proj]


class Lfm2Model(LlamaModel):
    """LlamaModel's weights, attention and FFN blocks and output; short-conv layers in place of attention
    where cfg.conv_layers says so (those are never fused: prepare_layer sees no AttentionWeights)."""

    output_norm_name = OUTPUT_NORM

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        if be.name not in CONV_BACKENDS:
            raise UnsupportedArchitectureError(
                f"{gguf.path}: architecture 'lfm2' (short convolutions with a per-sequence state) is not "
                f"implemented on the {be.name} backend (supported there on: {', '.join(CONV_BACKENDS)})"
            )
        # conv layer il -> its row in a sequence's state [conv layers, L - 1, n_embd]; attention layer il ->
        # its layer in the KV cache, which holds the attention layers only (cfg.n_kv_layers)
        self.conv_index = {il: i for i, il in enumerate(il for il, c in enumerate(cfg.conv_layers) if c)}
        self.kv_index = {il: i for i, il in enumerate(il for il, c in enumerate(cfg.conv_layers) if not c)}
        super().__init__(cfg, gguf, be, progress)

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        if not self.cfg.conv_layers[il]:
            return super().load_layer(src, il)
        be, e, L, p = self.be, self.cfg.n_embd, self.cfg.conv_l_cache, f"blk.{il}."
        conv_t = src.get(p + CONV_TENSOR, (e, L))
        conv = np.ascontiguousarray(be.to_host(be.load_vector(conv_t)), np.float32).reshape(e, L)
        mixer = ShortConvWeights(
            norm=be.load_vector(src.get(p + "attn_norm.weight", (e,))),
            in_proj=be.load_matrix([src.get(p + "shortconv.in_proj.weight", (3 * e, e))]),
            conv=conv,
            out_proj=be.load_matrix([src.get(p + "shortconv.out_proj.weight", (e, e))]),
        )
        return mixer, load_feed_forward(be, src, self.cfg, il)

    def _layers(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        be, cfg = self.be, self.cfg
        state = batch.conv_state
        want = (batch.block_tables.shape[0], len(self.conv_index), cfg.conv_l_cache - 1, cfg.n_embd)
        if state is None or state.shape != want or state.dtype != np.float32:
            got = None if state is None else (state.shape, state.dtype)
            raise GGUFError(f"lfm2: the batch's conv state is {got}, expected {want} float32 (ModelRunner)")
        inp = be.step_inputs(batch)
        x = self.embed(batch, inp)  # [T, n_embd]
        for il, (mixer, ffn_w) in enumerate(self.layers):
            fused = self.fused[il]
            if fused is not None and be.decoder_layer(fused, x, kv, self.kv_index[il], inp):
                continue
            if cfg.conv_layers[il]:
                short_conv_block(be, cfg, mixer, x, batch, state[:, self.conv_index[il]])
            else:
                where = (inp.positions, inp.seq_index, inp.block_tables, inp.slots)
                attention_block(be, cfg, mixer, x, batch, kv, il, *where, kv_layer=self.kv_index[il])
            self.ffn_block(be, cfg, ffn_w, x, batch.n_tokens)
        return x, inp


def short_conv_block(
    be: Backend, cfg: ModelConfig, w: ShortConvWeights, x: Any, batch: ForwardBatch, state: np.ndarray
) -> None:
    """x += W_out (C * conv(B * x_in)) for every token (in place). x: [T, n_embd]; state: [S, L-1, n_embd],
    row s the last L-1 conv inputs of batch sequence s, advanced here past its tokens."""
    T, e = batch.n_tokens, cfg.n_embd
    h = pre_norm(be, cfg, w.norm, x, T)
    bcx = be.empty((T, 3 * e))
    be.matmul(h, w.in_proj, bcx)  # [T, B | C | x]
    bcx = be.to_host(bcx)
    b, c, u = bcx[:, :e], bcx[:, e : 2 * e], bcx[:, 2 * e :]
    v = b * u  # [T, n_embd] the conv's input
    y = np.empty((T, e), np.float32)
    taps = w.conv.T  # [L, n_embd]
    L = taps.shape[0]
    # the batch's tokens are grouped by sequence, in order: one contiguous run of rows per sequence
    seq = batch.seq_index
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    for r0, r1 in zip(starts, np.r_[starts[1:], T], strict=True):
        s, n = int(seq[r0]), int(r1 - r0)
        window = np.concatenate([state[s], v[r0:r1]])  # [L-1+n, n_embd]: past inputs, then these
        out = window[0:n] * taps[0]
        for k in range(1, L):
            out += window[k : k + n] * taps[k]
        y[r0:r1] = c[r0:r1] * out
        state[s] = window[n:]  # the last L-1 inputs
    o = be.empty((T, e))
    be.matmul(be.from_host(y), w.out_proj, o)  # [T, n_embd]
    be.add(x, o)


MODEL = Lfm2Model
