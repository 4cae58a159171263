"""The BERT-family encoder pass that bert.py, nomic_bert.py and jina_bert_v2.py declare (llama.cpp's
llama_model_bert::graph, which the other two run too): non-causal attention over each whole input, post-norm
layers, and the classification head of a reranker. Embedding models only: nothing here projects onto a
vocabulary. jina-bert-v2 adds ALiBi (alibi_slopes), LayerNorms of Q and K and a second attention norm
(EncoderLayer's optional fields), and GEGLU MLPs (EncoderLayer.ffn).

x = layernorm(embed(tokens) + token_types[0] (+ position_embd[positions])) * tok_norm + tok_norm_b
for each layer:
    a = Wo @ attention(Wq x + bq, Wk x + bk, Wv x + bv) + bo      # every token sees its whole input; rope
                                                                # on Q, K where the architecture has it
    x = layernorm(a + x) * attn_output_norm + attn_output_norm_b
    f = W_down @ gelu(W_up x + b_up) + b_down                   # nomic: W_down @ (silu(W_gate x) * W_up x)
    x = layernorm(f + x) * layer_output_norm + layer_output_norm_b
hidden = x                                                      # what the pooling (engine/pooling.py) reads
score = cls_out @ tanh(cls @ hidden[CLS] + cls_b) + cls_out_b   # pooling "rank": a cross-encoder's head

Token types are all 0 ("sentence A"), as llama.cpp hardcodes them. The engine runs an encoder's input in
one step (scheduler: SchedulerConfig.whole_inputs): attention needs every key of the input, and the
forward pass checks that each sequence it gets starts at position 0. Attention runs on the host in float32
(numpy): encoders are small and their inputs short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import ForwardBatch, TensorSource, load_biases
from edgellm.gguf.metadata import get_float, get_int
from edgellm.gguf.model_config import ModelConfig, UnsupportedArchitectureError
from edgellm.gguf.reader import GGUFError, GGUFFile

if TYPE_CHECKING:
    from edgellm.backends.base import Backend

# llama.cpp's enum llama_pooling_type as an encoder reads {arch}.pooling_type (absent: NONE, per-token
# vectors, which an embeddings API cannot serve)
ENCODER_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
ENCODER_KEYS = frozenset(
    {"attention.layer_norm_epsilon", "attention.causal", "classifier.output_labels", "pooling_type"}
)
ENCODER_NORMS = frozenset(
    f"{n}.{p}" for n in ("attn_output_norm", "layer_output_norm") for p in ("weight", "bias")
)
HEAD_TENSORS = frozenset({"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"})
ENCODER_GLOBALS = frozenset({"token_embd.weight", "token_types.weight", "token_embd_norm.weight",
                             "token_embd_norm.bias"}) | HEAD_TENSORS  # fmt: skip


def read_encoder(g: GGUFFile, cfg: ModelConfig) -> None:
    """What llama.cpp reads for every BERT-family encoder: layer_norm_epsilon (required), attention.causal
    (must be false here), pooling_type (absent: none), classifier.output_labels (the head's outputs),
    tokenizer.ggml.token_type_count (required, at least 1)."""
    p = cfg.arch + "."
    cfg.layer_norm_eps = get_float(g, p + "attention.layer_norm_epsilon", lo=0.0, hi=1.0, lo_open=True)
    causal = g.get(p + "attention.causal", False)
    if causal is not False:
        raise GGUFError(
            f"{g.path}: metadata {p}attention.causal = {causal!r}: a causal {cfg.arch} is not implemented"
        )
    raw = get_int(g, p + "pooling_type", 0, lo=0, hi=4)
    cfg.pooling = ENCODER_POOLING[raw]
    cfg.causal = False
    cfg.rank_head = True
    labels = g.get(p + "classifier.output_labels")
    if labels is not None:
        if not isinstance(labels, list) or not labels:
            raise GGUFError(
                f"{g.path}: metadata {p}classifier.output_labels must be a non-empty array of strings"
            )
        cfg.n_cls_out = len(labels)
    get_int(g, "tokenizer.ggml.token_type_count", lo=1, hi=1 << 16, why="llama.cpp requires it for encoders")
    if cfg.n_heads * cfg.head_dim != cfg.n_embd or cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{g.path}: {cfg.arch} heads of {cfg.head_dim} x {cfg.n_heads} must span the width {cfg.n_embd}"
        )


@dataclass
class EncoderLayer:
    wqkv: Any  # [3 * n_embd, n_embd] Q|K|V
    bqkv: Any  # [3 * n_embd] or None
    wo: Any  # [n_embd, n_embd]
    bo: Any  # [n_embd] or None
    attn_norm: tuple[Any, Any]  # attn_output_norm (weight, bias) [n_embd] each
    ffn: str  # "gelu": gelu(W_up x); "swiglu" / "geglu": act(gate) * up of W_up = [gate | up]
    w_up: Any  # [n_ff, n_embd] (gelu); [2 * n_ff, n_embd] gate|up (swiglu, geglu)
    b_up: Any  # [n_ff] / [2 * n_ff] or None
    w_down: Any  # [n_embd, n_ff]
    b_down: Any  # [n_embd] or None
    out_norm: tuple[Any, Any]  # layer_output_norm (weight, bias)
    q_norm: tuple[Any, Any] | None = None  # LayerNorm of Q, of K over the whole [n_embd] (jina-bert-v2)
    k_norm: tuple[Any, Any] | None = None
    norm_2: tuple[Any, Any] | None = None  # attn_norm_2: x = norm2(x + layer input) after attn_output_norm


class EncoderModel:
    rope = False  # nomic: rope on Q and K
    position_embd = True  # bert: learned absolute positions
    alibi_max_bias = 0.0  # jina-bert-v2: ALiBi, each head's bias slope * -|i - j| (llama.cpp's max_bias 8)

    def __init__(self, cfg: ModelConfig, gguf: GGUFFile, be: Backend, progress=None) -> None:
        from edgellm.backends.base import StepIndex  # arch files import no backend at load (registry.py)

        if be.name != "cpu":  # the pass is generic backend calls, but no device run has checked it
            raise UnsupportedArchitectureError(
                f"{cfg.arch} (an encoder) runs on the CPU backend only: not yet checked on {be.name} "
                "(use --backend cpu)"
            )
        self.cfg, self.be = cfg, be
        src = TensorSource(gguf)
        e, V = cfg.n_embd, cfg.n_vocab
        self.tok_embd = be.load_matrix([src.get("token_embd.weight", (V, e))])  # [V, n_embd]
        self.type_row = None  # [n_embd]: token type 0's embedding, added to every token
        if src.has("token_types.weight"):
            n_types = gguf.tensors["token_types.weight"].shape[0]
            types = be.load_matrix([src.get("token_types.weight", (n_types, e))])
            zero = np.zeros(1, np.int32)
            self.type_row = be.from_host(
                be.to_host(be.embed(types, StepIndex(zero, be.from_host(zero)), 1.0))[0]
            )
        self.pos_embd = None
        if self.position_embd:
            self.pos_embd = be.load_matrix([src.get("position_embd.weight", (cfg.n_ctx_train, e))])
        self.tok_norm = self._norm(src, "token_embd_norm")
        self.layers: list = []  # no decoder layers (arch/common.py's walks over (attention, FFN) pairs)
        self.blocks: list[EncoderLayer] = []
        for il in range(cfg.n_layers):
            self.blocks.append(self._load_layer(src, il))
            gguf.release_pages()
            if progress:
                progress(il + 1, cfg.n_layers)
        # the classification head (pooling "rank"), each part optional as llama.cpp reads it
        self.cls = self.cls_b = self.cls_out = self.cls_out_b = None
        self.cls_rows = e  # cls [n_embd, n_embd] (jina-bert-v2's rerankers: [1, n_embd], no cls.output)
        if src.has("cls.weight"):
            self.cls_rows = gguf.tensors["cls.weight"].shape[0]
            self.cls = be.load_matrix([src.get("cls.weight", (self.cls_rows, e))])
            self.cls_b = load_biases(be, src, [("cls.bias", self.cls_rows)])
        if src.has("cls.output.weight"):
            self.cls_out = be.load_matrix(
                [src.get("cls.output.weight", (cfg.n_cls_out, e))]
            )  # [n_cls_out, n_embd]
            self.cls_out_b = load_biases(be, src, [("cls.output.bias", cfg.n_cls_out)])
        gguf.release_pages()

    def _norm(self, src: TensorSource, name: str) -> tuple[Any, Any]:
        e = self.cfg.n_embd
        return self.be.load_vector(src.get(name + ".weight", (e,))), self.be.load_vector(
            src.get(name + ".bias", (e,))
        )

    def _load_layer(self, src: TensorSource, il: int) -> EncoderLayer:
        be, p, e, f = self.be, f"blk.{il}.", self.cfg.n_embd, self.cfg.n_ff
        if self.cfg.qkv_fused[il]:
            wqkv = be.load_matrix([src.get(p + "attn_qkv.weight", (3 * e, e))])
            bqkv = load_biases(be, src, [(p + "attn_qkv.bias", 3 * e)])
        else:
            wqkv = be.load_matrix([src.get(p + f"attn_{n}.weight", (e, e)) for n in "qkv"])
            bqkv = load_biases(be, src, [(p + f"attn_{n}.bias", e) for n in "qkv"])
        ffn, w_up, b_up, b_down = self.load_ffn(src, il)
        optional = {
            field: self._norm(src, p + name) if src.has(p + name + ".weight") else None
            for field, name in (
                ("q_norm", "attn_q_norm"),
                ("k_norm", "attn_k_norm"),
                ("norm_2", "attn_norm_2"),
            )
        }  # the spec lists them where the architecture has them (jina-bert-v2)
        return EncoderLayer(
            **optional,
            wqkv=wqkv,
            bqkv=bqkv,
            wo=be.load_matrix([src.get(p + "attn_output.weight", (e, e))]),
            bo=load_biases(be, src, [(p + "attn_output.bias", e)]),
            attn_norm=self._norm(src, p + "attn_output_norm"),
            ffn=ffn,
            w_up=w_up,
            b_up=b_up,
            w_down=be.load_matrix([src.get(p + "ffn_down.weight", (e, f))]),
            b_down=b_down,
            out_norm=self._norm(src, p + "layer_output_norm"),
        )

    def load_ffn(self, src: TensorSource, il: int) -> tuple[str, Any, Any, Any]:
        """(kind, W_up, its bias, W_down's bias) of layer il's MLP: bert's gelu(W_up x + b_up), biased."""
        be, p, e, f = self.be, f"blk.{il}.", self.cfg.n_embd, self.cfg.n_ff
        w_up = be.load_matrix([src.get(p + "ffn_up.weight", (f, e))])
        b_up = load_biases(be, src, [(p + "ffn_up.bias", f)])
        return "gelu", w_up, b_up, load_biases(be, src, [(p + "ffn_down.bias", e)])

    def weight_matrices(self) -> list[Any]:
        """Every matrix one pass reads (arch/common.py weight_bytes_per_token)."""
        head = [m for m in (self.cls, self.cls_out) if m is not None]
        return [m for w in self.blocks for m in (w.wqkv, w.wo, w.w_up, w.w_down)] + head

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch, kv: Any) -> Any:
        """No vocabulary projection: an encoder only embeds (the engine refuses generation and scoring
        for it: EngineCore.add_request). The layers run (the start-up warm-up compiles their kernels);
        the logits asked for are zeros."""
        self._layers(batch)
        return np.zeros((len(batch.logits_index), self.cfg.n_vocab), np.float32)

    def forward_hidden(self, batch: ForwardBatch, kv: Any) -> tuple[Any, Any]:
        """(no logits, the final hidden states [H, n_embd] at batch.hidden_index); with pooling "rank" the
        classification head's outputs [H, n_cls_out] instead (the rows are then the inputs' first tokens)."""
        x = self._layers(batch)
        hidden = self.be.take_rows(x, batch.hidden_index)
        if self.cfg.pooling == "rank":
            hidden = self._head(hidden)
        return np.zeros((len(batch.logits_index), self.cfg.n_vocab), np.float32), hidden

    def _host_layernorm(self, x: np.ndarray, norm: tuple[Any, Any]) -> np.ndarray:
        h = self.be.from_host(np.ascontiguousarray(x, np.float32))
        self.be.layernorm(h, *norm, self.cfg.layer_norm_eps, h)
        return self.be.to_host(h)

    def _head(self, h: Any) -> Any:
        """llama.cpp's build_pooling RANK: tanh(cls @ h + cls_b), then cls_out @ . + cls_out_b."""
        be = self.be
        if self.cls is not None:
            t = be.empty((h.shape[0], self.cls_rows))
            be.matmul(h, self.cls, t)
            if self.cls_b is not None:
                be.add_bias(t, self.cls_b)
            h = be.from_host(np.tanh(be.to_host(t)).astype(np.float32))
        if self.cls_out is not None:
            out = be.empty((h.shape[0], self.cfg.n_cls_out))
            be.matmul(h, self.cls_out, out)
            if self.cls_out_b is not None:
                be.add_bias(out, self.cls_out_b)
            h = out
        return h

    def _layers(self, batch: ForwardBatch) -> Any:
        from edgellm.backends.base import StepIndex

        be, cfg = self.be, self.cfg
        spans = sequence_spans(batch)
        inp = be.step_inputs(batch)
        T, e = batch.n_tokens, cfg.n_embd
        x = be.embed(self.tok_embd, inp.token_ids, 1.0)  # [T, n_embd]
        if self.type_row is not None:
            be.add_bias(x, self.type_row)
        if self.pos_embd is not None:
            be.add(x, be.embed(self.pos_embd, StepIndex(np.asarray(batch.positions), inp.positions), 1.0))
        be.layernorm(x, *self.tok_norm, cfg.layer_norm_eps, x)
        for w in self.blocks:
            qkv = be.empty((T, 3 * e))
            be.matmul(x, w.wqkv, qkv)
            if w.bqkv is not None:
                be.add_bias(qkv, w.bqkv)
            host = be.to_host(qkv)
            q = np.ascontiguousarray(host[:, :e]).reshape(T, cfg.n_heads, cfg.head_dim)  # [T, H, d]
            k = np.ascontiguousarray(host[:, e : 2 * e]).reshape(T, cfg.n_heads, cfg.head_dim)
            v = host[:, 2 * e :].reshape(T, cfg.n_heads, cfg.head_dim)
            if w.q_norm is not None:  # over each token's whole Q (K): [T, n_embd]
                q = self._host_layernorm(q.reshape(T, e), w.q_norm).reshape(T, cfg.n_heads, cfg.head_dim)
            if w.k_norm is not None:
                k = self._host_layernorm(k.reshape(T, e), w.k_norm).reshape(T, cfg.n_heads, cfg.head_dim)
            if self.rope:
                q, k = be.from_host(q), be.from_host(k)
                be.rope(q, inp.positions, cfg.rope)
                be.rope(k, inp.positions, cfg.rope)
                q, k = be.to_host(q), be.to_host(k)
            slopes = alibi_slopes(cfg.n_heads, self.alibi_max_bias) if self.alibi_max_bias else None
            attn = bidirectional_attention(q, k, v, spans, cfg.attn_scale, slopes)
            attn = be.from_host(attn.reshape(T, e))
            a = be.empty((T, e))
            be.matmul(attn, w.wo, a)
            if w.bo is not None:
                be.add_bias(a, w.bo)
            be.add(a, x)
            be.layernorm(a, *w.attn_norm, cfg.layer_norm_eps, a)  # x = norm(attention + x)
            if w.norm_2 is not None:
                be.add(a, x)
                be.layernorm(a, *w.norm_2, cfg.layer_norm_eps, a)
            x = a
            if w.ffn != "gelu":
                gate_up = be.empty((T, 2 * cfg.n_ff))
                be.matmul(x, w.w_up, gate_up)
                if w.b_up is not None:
                    be.add_bias(gate_up, w.b_up)
                h = be.empty((T, cfg.n_ff))
                be.gated_act(gate_up, h, "silu" if w.ffn == "swiglu" else "gelu")
            else:
                h = be.empty((T, cfg.n_ff))
                be.matmul(x, w.w_up, h)
                if w.b_up is not None:
                    be.add_bias(h, w.b_up)
                be.gelu(h)
            out = be.empty((T, e))
            be.matmul(h, w.w_down, out)
            if w.b_down is not None:
                be.add_bias(out, w.b_down)
            be.add(out, x)
            be.layernorm(out, *w.out_norm, cfg.layer_norm_eps, out)  # x = norm(ffn + x)
            x = out
        return x


def alibi_slopes(n_heads: int, max_bias: float) -> np.ndarray:
    """Each head's ALiBi slope as ggml_soft_max_ext computes it: [n_heads] float32."""
    n_log2 = 1 << int(np.floor(np.log2(n_heads)))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    h = np.arange(n_heads)
    return np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1)).astype(np.float32)


def sequence_spans(batch: ForwardBatch) -> list[tuple[int, int]]:
    """(start, end) of each sequence's tokens in the batch, in order. Each must be a whole input, positions
    0..n-1: an encoder's attention over part of one would be silently wrong."""
    seq = np.asarray(batch.seq_index)
    pos = np.asarray(batch.positions)
    cuts = np.flatnonzero(np.diff(seq)) + 1
    bounds = [0, *cuts.tolist(), len(seq)]
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    for s, t in spans:
        if not np.array_equal(pos[s:t], np.arange(t - s)):
            raise RuntimeError(
                f"an encoder input must run in one step from position 0, got positions {pos[s]}..{pos[t - 1]}"
            )
    return spans


def bidirectional_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    spans: list[tuple[int, int]],
    scale: float,
    slopes: np.ndarray | None = None,
) -> np.ndarray:
    """softmax(scale * Q K^T (+ ALiBi: slope_h * -|i - j|)) V within each span, no mask inside it:
    q, k, v [T, H, d] -> [T, H, d]."""
    out = np.empty_like(q, dtype=np.float32)
    for s, t in spans:
        qh = np.ascontiguousarray(q[s:t].transpose(1, 0, 2), np.float32)  # [H, n, d]
        kh = np.ascontiguousarray(k[s:t].transpose(1, 2, 0), np.float32)  # [H, d, n]
        scores = np.matmul(qh, kh) * np.float32(scale)  # [H, n, n]: batched BLAS, not einsum's loops
        if slopes is not None:
            n = np.arange(t - s)
            scores -= slopes[:, None, None] * np.abs(n[:, None] - n[None, :]).astype(np.float32)
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        vh = np.ascontiguousarray(v[s:t].transpose(1, 0, 2), np.float32)  # [H, n, d]
        out[s:t] = np.matmul(scores, vh).transpose(1, 0, 2)
    return out
