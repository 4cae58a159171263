"""Llama-family decoder: Llama 2/3, SmolLM2, TinyLlama, Mistral, Mixtral (experts in place of the FFN); the
model class most architecture files reuse, their differences being ModelConfig flags (arch/common.py).

x = embed(tokens)                                  # [T, n_embd]
for each layer:
    x += Wo @ attention(rope(Wq h), rope(Wk h), Wv h)    with h = rmsnorm(x) * attn_norm
    x += W_down @ (silu(W_gate h) * (W_up h))            with h = rmsnorm(x) * ffn_norm
logits = W_out @ (rmsnorm(x) * output_norm)        # only at the tokens that need logits
hidden = rmsnorm(x) * output_norm                  # only at the tokens an embedding pools
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import (
    AttentionWeights,
    FeedForwardWeights,
    ForwardBatch,
    TensorSource,
    attention_block,
    feed_forward_block,
    load_attention,
    load_feed_forward,
    model_norm,
)
from edgellm.arch.moe import load_moe_feed_forward, moe_feed_forward_block
from edgellm.arch.spec import (
    EXPERT_KEYS,
    EXPERT_TENSORS,
    LLAMA_BIASES,
    LLAMA_BLOCK,
    QKV_BIASES,
    ArchSpec,
    Experts,
)
from edgellm.gguf.model_config import ROPE_NORM, ModelConfig
from edgellm.gguf.reader import GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

SPEC = ArchSpec(
    name="llama",
    # Mixtral: the experts in place of the dense FFN; optional output-projection and FFN biases
    block_tensors=LLAMA_BLOCK | QKV_BIASES | LLAMA_BIASES | EXPERT_TENSORS,
    keys=EXPERT_KEYS,
    fused_qkv=True,
    rope_type=ROPE_NORM,  # the converter permutes Q/K rows for rotating adjacent pairs
    rope_freq_factors=True,  # llama3's rope_freqs.weight
    # llama.cpp's norm_w for llama: the top-k probabilities renormalised; a dense model without experts
    experts=Experts(renormalise=True, optional=True),
)


class LlamaModel:
    output_norm_name = "output_norm.weight"  # the final norm (LFM2's converter names it token_embd_norm)

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        self.cfg, self.be = cfg, be
        src = TensorSource(gguf)
        e, V = cfg.n_embd, cfg.n_vocab
        self.tok_embd = be.load_matrix([src.get("token_embd.weight", (V, e))])  # [V, n_embd]
        gguf.release_pages()  # the embedding's raw blocks (the largest tensor of a small model) are repacked
        self.layers = []
        # a mixture of experts in place of the dense FFN (Mixtral; qwen3moe, olmoe): arch/moe.py
        self.ffn_block = moe_feed_forward_block if cfg.n_expert else feed_forward_block
        for il in range(cfg.n_layers):
            self.layers.append(self.load_layer(src, il))
            gguf.release_pages()  # raw blocks of this layer are repacked: keep them out of RSS
            if progress:
                progress(il + 1, cfg.n_layers)
        # the backend's one-call form of each layer, where it has one (None: the blocks' kernel calls)
        # (a mixture-of-experts layer: its attention block, then the experts through ffn_block)
        self.fused = [
            be.prepare_layer(cfg, a, f if isinstance(f, FeedForwardWeights) else None, il)
            if isinstance(a, AttentionWeights)
            else None
            for il, (a, f) in enumerate(self.layers)
        ]
        self.output_norm = be.load_vector(src.get(self.output_norm_name, (e,)))
        self.output_norm_b = be.load_vector(src.get("output_norm.bias", (e,))) if cfg.layer_norm else None
        # A reranker's head (Qwen 3: cls.output [n_cls_out, n_embd]; the specs that may have one say so)
        self.cls_out = None
        if src.has("cls.output.weight"):
            self.cls_out = be.load_matrix([src.get("cls.output.weight", (cfg.n_cls_out, e))])
        # Tied embeddings: without output.weight the embedding matrix is the vocabulary projection.
        self.output = (
            be.load_matrix([src.get("output.weight", (V, e))]) if src.has("output.weight") else self.tok_embd
        )
        gguf.release_pages()

    def load_layer(self, src: TensorSource, il: int) -> tuple[Any, Any]:
        """Layer il's attention and feed-forward weights (arch/common.py's dataclasses)."""
        load_ffn = load_moe_feed_forward if self.cfg.n_expert else load_feed_forward
        return load_attention(self.be, src, self.cfg, il), load_ffn(self.be, src, self.cfg, il)

    def embed(self, batch: ForwardBatch, inp: Any) -> Any:
        """The residual stream's start [T, n_embd]: the tokens' embeddings (times cfg.embd_scale); an
        image's rows are its embeddings as given (llama.cpp scales token embeddings only: gemma3.cpp)."""
        x = self.be.embed(self.tok_embd, inp.token_ids, self.cfg.embd_scale)
        if batch.embed_rows is None or not len(batch.embed_rows):
            return x
        host = self.be.to_host(x)  # a copy on a device backend; the array itself on the CPU
        host[batch.embed_rows] = batch.embeds
        return host if host is x else self.be.from_host(host)

    def forward(self, batch: ForwardBatch, kv: Any) -> Any:
        """Logits [L, n_vocab] at batch.logits_index, after writing the batch's K/V. A backend array: the
        runner copies it to the host or has the backend sample from it where it is."""
        x, inp = self._layers(batch, kv)
        norm = (self.output_norm, self.output_norm_b)
        return output_logits(self.be, self.cfg, x, batch, inp.logits_index, norm, self.output)

    def forward_hidden(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        """forward()'s logits, and the final hidden states after the output norm [H, n_embd] at
        batch.hidden_index (what embeddings pool), from the same pass."""
        x, inp = self._layers(batch, kv)
        hidden = self.be.take_rows(x, batch.hidden_index)  # a copy: output_logits may overwrite x
        model_norm(self.be, self.cfg, hidden, self.output_norm, self.output_norm_b, hidden)
        norm = (self.output_norm, self.output_norm_b)
        logits = output_logits(self.be, self.cfg, x, batch, inp.logits_index, norm, self.output)
        if self.cfg.pooling == "rank" and self.cls_out is not None:  # rows: the inputs' last tokens
            scores = self.be.empty((hidden.shape[0], self.cfg.n_cls_out))
            self.be.matmul(hidden, self.cls_out, scores)
            z = self.be.to_host(scores).astype(np.float64)
            z = np.exp(z - z.max(axis=-1, keepdims=True))
            z /= z.sum(axis=-1, keepdims=True)  # ggml_soft_max over the labels
            hidden = self.be.from_host(z.astype(np.float32))
        return logits, hidden

    def _layers(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        """The residual stream [T, n_embd] after the last layer, having written the batch's K/V, and the
        step's inputs as the backend holds them (be.step_inputs)."""
        be, cfg = self.be, self.cfg
        inp = be.step_inputs(batch)
        x = self.embed(batch, inp)  # [T, n_embd]
        # a non-causal image's tokens have causal limits apart from their positions: the blocks' calls
        # take them, the fused layers do not
        limits = None if batch.attn_positions is None else be.from_host(batch.attn_positions)
        for il, (attn_w, ffn_w) in enumerate(self.layers):
            fused = self.fused[il] if limits is None else None
            # a layer with LoRA updates this step runs the blocks, where the updates sit beside each matmul
            lora = batch.lora if batch.lora is not None and batch.lora.touches(il) else None
            if fused is not None and lora is None and be.decoder_layer(fused, x, kv, il, inp):
                if not isinstance(ffn_w, FeedForwardWeights):
                    self.ffn_block(be, cfg, ffn_w, x, batch.n_tokens)
                continue
            attention_block(
                be, cfg, attn_w, x, batch, kv, il, inp.positions, inp.seq_index, inp.block_tables, inp.slots,
                attn_positions=limits,
            )  # fmt: skip
            if lora is not None and isinstance(ffn_w, FeedForwardWeights):
                feed_forward_block(be, cfg, ffn_w, x, batch.n_tokens, lora, il)
            else:
                self.ffn_block(be, cfg, ffn_w, x, batch.n_tokens)
        return x, inp


def output_logits(
    be: Backend,
    cfg: ModelConfig,
    x: Any,
    batch: ForwardBatch,
    logits_index: Any,
    norm: tuple[Any, Any],
    w_out: Any,
) -> Any:
    """Final norm and vocabulary projection, only for the rows in batch.logits_index (a backend array;
    logits_index: the same rows as step_inputs gave them). norm: (weight, bias: LayerNorm's, else None)."""
    if len(batch.logits_index) == 0:
        return np.empty((0, cfg.n_vocab), np.float32)
    # x itself when every row needs logits (its last use: the norm may overwrite it)
    h = be.take_rows(x, logits_index) if len(batch.logits_index) != batch.n_tokens else x
    model_norm(be, cfg, h, norm[0], norm[1], h)
    logits = be.empty((h.shape[0], cfg.n_vocab))  # [L, n_vocab]
    be.matmul(h, w_out, logits)
    if batch.lora is not None:
        batch.lora.add((-1, "output"), h, logits, logits_rows=True)
    if cfg.logit_scale != 1.0:
        logits = be.scale(logits, np.float32(1.0) / np.float32(cfg.logit_scale))  # as llama.cpp's Granite
    if cfg.final_logit_softcap > 0:
        logits = be.softcap(logits, cfg.final_logit_softcap)
    return logits


MODEL = LlamaModel
