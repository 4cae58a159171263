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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.arch.common import ForwardBatch, TensorSource, attention_block, load_feed_forward, pre_norm
from edgellm.arch.llama import LlamaModel
from edgellm.backends.base import Backend
from edgellm.gguf.config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.lfm2 import CONV_TENSOR, OUTPUT_NORM
from edgellm.gguf.reader import GGUFError, GGUFFile

# Backends whose arrays are host numpy arrays, which the conv below works on in place
CONV_BACKENDS = ("cpu",)


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
