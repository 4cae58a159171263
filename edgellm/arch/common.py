"""What every architecture file shares: the batch description, tensor lookup with shape checks, and
the attention / feed-forward blocks that differ between architectures only by flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import GGUFError, GGUFFile, TensorInfo

if TYPE_CHECKING:  # the arch files import no backend at load: a front-end reads their specs (registry.py)
    from edgellm.backends.base import Backend


@dataclass
class ForwardBatch:
    """The tokens one forward pass computes, possibly from several sequences (grouped, in order)."""

    token_ids: np.ndarray  # [T] int32: tokens to compute this step
    positions: np.ndarray  # [T] int32: position of each token in its sequence
    seq_index: np.ndarray  # [T] int32: row of block_tables holding the token's sequence
    block_tables: np.ndarray  # [S, max_blocks] int32: KV block ids of each sequence, in order
    slots: np.ndarray  # [T] int64: KV slot of each token = block_id * block_size + position % block_size
    logits_index: np.ndarray  # [L] int32: which of the T tokens need logits (vocabulary projection)
    # [H] int32: which of the T tokens' final hidden states are wanted (embeddings; forward_hidden)
    hidden_index: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    # [S, conv layers, l_cache - 1, n_embd] float32: each sequence's recurrent state (cfg.recurrent models,
    # LFM2: engine/conv_state.py), read and advanced in place by the forward pass; None without one
    conv_state: np.ndarray | None = None
    # the LoRA updates of this step (edgellm/lora/apply.py's LoraStep: rows grouped by adapter); None when
    # no token of the step uses an adapter
    lora: Any = None
    # Images (engine/media.py): rows of the batch whose embeddings are given instead of looked up
    embed_rows: np.ndarray | None = None  # [R] int32
    embeds: np.ndarray | None = None  # [R, n_embd] float32
    # [T] int32 each token's causal limit where it differs from its position (a non-causal image's
    # tokens see the whole image); None: the positions
    attn_positions: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


class TensorSource:
    """Looks tensors up by name and checks their shapes, so a bad file fails at load with a clear error."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf

    def get(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        t = self.gguf.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.gguf.path}: missing tensor {name!r}")
        if tuple(t.shape) != tuple(shape):
            raise GGUFError(f"{self.gguf.path}: tensor {name!r} has shape {t.shape}, expected {shape}")
        return t

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors


@dataclass
class AttentionWeights:
    norm: Any  # [n_embd]; None without pre-norms (OLMo 2)
    wqkv: Any  # [(H + 2*Hkv) * d, n_embd] fused Q|K|V
    wo: Any  # [n_embd, H * dv]
    bqkv: Any = None  # [(H + 2*Hkv) * d] Q|K|V biases (Qwen 2; optional on llama, Qwen 3, Gemma 3)
    bo: Any = None  # [n_embd] output-projection bias (optional on llama)
    q_norm: Any = None  # [d] (Gemma 3, Qwen 3); [H * d] over the whole projection (OLMo 2)
    k_norm: Any = None  # [d]; [Hkv * d] (OLMo 2)
    post_norm: Any = None  # [n_embd] (Gemma)
    norm_b: Any = None  # [n_embd] the pre-norm's bias (LayerNorm: StarCoder 2, GPT-2)
    sinks: Any = None  # [H] each head's extra softmax logit (gpt-oss's attention sinks)


@dataclass
class FeedForwardWeights:
    norm: Any  # [n_embd]; None without pre-norms (OLMo 2)
    w_gate_up: Any  # [2 * n_ff, n_embd] fused gate|up; [n_ff, n_embd] up alone when not cfg.gated_ffn
    w_down: Any  # [n_embd, n_ff]
    post_norm: Any = None  # [n_embd] (Gemma)
    b_gate_up: Any = None  # [2 * n_ff] gate|up biases (optional on llama)
    b_down: Any = None  # [n_embd] (optional on llama)
    norm_b: Any = None  # [n_embd] the pre-norm's bias (LayerNorm)


def load_attention(be: Backend, src: TensorSource, cfg: ModelConfig, il: int) -> AttentionWeights:
    p = f"blk.{il}."
    e, d, dv = cfg.n_embd, cfg.head_dim, cfg.head_dim_v
    qkv_rows = {"q": cfg.n_heads * d, "k": cfg.n_kv_heads * d, "v": cfg.n_kv_heads * dv}
    if cfg.qkv_fused[il]:  # one matrix, already stacked Q|K|V (Phi-3)
        qkv = [src.get(p + "attn_qkv.weight", (sum(qkv_rows.values()), e))]
    else:
        qkv = [src.get(p + f"attn_{n}.weight", (rows, e)) for n, rows in qkv_rows.items()]
    w = AttentionWeights(
        norm=be.load_vector(src.get(p + "attn_norm.weight", (e,))) if cfg.pre_norms else None,
        wqkv=be.load_matrix(qkv),
        wo=be.load_matrix([src.get(p + "attn_output.weight", (e, cfg.n_heads * dv))]),
    )
    if src.has(p + "attn_qkv.bias"):
        w.bqkv = load_biases(be, src, [(p + "attn_qkv.bias", sum(qkv_rows.values()))])
    else:  # with either form of the weights (validation.check_qkv_forms)
        w.bqkv = load_biases(be, src, [(p + f"attn_{n}.bias", rows) for n, rows in qkv_rows.items()])
    w.bo = load_biases(be, src, [(p + "attn_output.bias", e)])
    if cfg.qk_norm or cfg.qk_norm_full:
        q_len, k_len = (cfg.n_heads * d, cfg.n_kv_heads * d) if cfg.qk_norm_full else (d, d)
        w.q_norm = be.load_vector(src.get(p + "attn_q_norm.weight", (q_len,)))
        w.k_norm = be.load_vector(src.get(p + "attn_k_norm.weight", (k_len,)))
    if cfg.post_norms:
        w.post_norm = be.load_vector(src.get(p + "post_attention_norm.weight", (e,)))
    return w


def load_feed_forward(
    be: Backend, src: TensorSource, cfg: ModelConfig, il: int, norm: str = "ffn_norm.weight"
) -> FeedForwardWeights:
    """Layer il's dense FFN; `norm`: its pre-norm's name (Seed-OSS: post_attention_norm.weight)."""
    p = f"blk.{il}."
    e, f = cfg.n_embd, cfg.n_ff
    if cfg.gate_up_fused:  # ffn_up holds gate|up, gate first (llama.cpp's swiglu of the two halves)
        gate_up = [src.get(p + "ffn_up.weight", (2 * f, e))]
    else:
        gate_up = [src.get(p + "ffn_gate.weight", (f, e)), src.get(p + "ffn_up.weight", (f, e))]
    w = FeedForwardWeights(
        norm=be.load_vector(src.get(p + norm, (e,))) if cfg.pre_norms else None,
        w_gate_up=be.load_matrix(gate_up),
        w_down=be.load_matrix([src.get(p + "ffn_down.weight", (e, f))]),
    )
    if cfg.post_norms:
        w.post_norm = be.load_vector(src.get(p + "post_ffw_norm.weight", (e,)))
    w.b_gate_up = load_biases(be, src, [(p + "ffn_gate.bias", f), (p + "ffn_up.bias", f)])
    w.b_down = load_biases(be, src, [(p + "ffn_down.bias", e)])
    return w


def load_biases(be: Backend, src: TensorSource, parts: list[tuple[str, int]]) -> Any:
    """The biases of a (stacked) matrix's parts as one vector, zeros for a part without one (llama.cpp
    reads each as optional); None when no part has one. parts: (tensor name, rows)."""
    if not any(src.has(name) for name, _ in parts):
        return None
    vectors = [
        be.to_host(be.load_vector(src.get(name, (rows,)))) if src.has(name) else np.zeros(rows, np.float32)
        for name, rows in parts
    ]
    return be.from_host(np.concatenate(vectors))


def model_norm(be: Backend, cfg: ModelConfig, x: Any, w: Any, b: Any, out: Any) -> None:
    """out = the architecture's norm of each row of x: rmsnorm(x) * w, or LayerNorm(x) * w + b."""
    if cfg.layer_norm:
        be.layernorm(x, w, b, cfg.layer_norm_eps, out)
    else:
        be.rmsnorm(x, w, cfg.rms_eps, out)


def pre_norm(be: Backend, cfg: ModelConfig, norm: Any, x: Any, T: int, bias: Any = None) -> Any:
    """norm(x) [T, n_embd], a new array; x itself without a pre-norm (OLMo 2: only read)."""
    if norm is None:
        return x
    h = be.empty((T, cfg.n_embd))
    model_norm(be, cfg, x, norm, bias, h)
    return h


def attention_block(
    be: Backend,
    cfg: ModelConfig,
    w: AttentionWeights,
    x: Any,
    batch: ForwardBatch,
    kv: Any,
    il: int,
    positions: Any,
    seq_index: Any,
    block_tables: Any,
    slots: Any,
    kv_layer: int | None = None,
    attn_positions: Any = None,
) -> None:
    """x += Attention(norm(x)) for every token of the batch (in place). x: [T, n_embd]. kv_layer: the
    layer's index in the KV cache when not il (LFM2's cache holds its attention layers only).
    attn_positions: each token's causal limit when not its position (ForwardBatch.attn_positions)."""
    kl = il if kv_layer is None else kv_layer
    T = batch.n_tokens
    H, Hkv, d, dv = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim_v
    h = pre_norm(be, cfg, w.norm, x, T, w.norm_b)
    qkv = be.empty((T, (H + Hkv) * d + Hkv * dv))
    be.matmul(h, w.wqkv, qkv)  # [T, H*d | Hkv*d | Hkv*dv]
    if batch.lora is not None:  # beside the matmul, before the bias (llama.cpp's build_lora_mm)
        batch.lora.add((il, "wqkv"), h, qkv)
    if w.bqkv is not None:
        be.add_bias(qkv, w.bqkv)
    # Contiguous copies (a few KB): one compiled specialization per kernel whatever T is, instead of a
    # C-layout one for T=1 and a strided one for T>1 (each costs compile time and ~5 MB of RSS).
    q = be.contiguous(qkv[:, : H * d].reshape(T, H, d))  # [T, H, d]
    k = be.contiguous(qkv[:, H * d : (H + Hkv) * d].reshape(T, Hkv, d))  # [T, Hkv, d]
    v = be.contiguous(qkv[:, (H + Hkv) * d :].reshape(T, Hkv, dv))  # [T, Hkv, dv]
    if cfg.qk_norm_full:  # one norm over each token's whole Q [H*d] and K [Hkv*d] (OLMo 2)
        q2, k2 = q.reshape(T, H * d), k.reshape(T, Hkv * d)
        be.rmsnorm(q2, w.q_norm, cfg.rms_eps, q2)
        be.rmsnorm(k2, w.k_norm, cfg.rms_eps, k2)
    elif w.q_norm is not None:
        be.rmsnorm_heads(q, w.q_norm, cfg.rms_eps)
        be.rmsnorm_heads(k, w.k_norm, cfg.rms_eps)
    rope = cfg.rope_of_layer(il)
    if rope is not None:  # None: no rotary embedding in this layer (GPT-2; SmolLM3's NoPE layers)
        be.rope(q, positions, rope)
        be.rope(k, positions, rope)
        if cfg.qk_norm_after_rope:  # Llama 4's L2 norm: an RMS norm of each head, no weight
            ones = be.from_host(np.ones(d, np.float32))
            be.rmsnorm_heads(q, ones, cfg.rms_eps)
            be.rmsnorm_heads(k, ones, cfg.rms_eps)
    be.write_kv(kv, kl, k, v, slots)
    # after rope and the K/V write: only the queries are scaled (llama.cpp's order); Llama 4: NoPE layers only
    if cfg.attn_temp_scale and (rope is None or not cfg.attn_temp_nope_only):
        q = temperature_scaled(be, cfg, q, batch.positions)
    attn = be.empty((T, H, dv))
    window = cfg.sliding_window if cfg.swa_layers[il] else 0
    scale, cap = cfg.attn_scale, cfg.attn_softcap
    limits = positions if attn_positions is None else attn_positions
    be.attention(q, kv, kl, block_tables, seq_index, limits, window, scale, attn, cap, w.sinks)
    if attn_positions is not None and window > 0:
        call = ((kv, kl, block_tables, seq_index, limits), (scale, cap, w.sinks))
        window_from_token(be, q, attn, batch, window, call)
    o = be.empty((T, cfg.n_embd))
    be.matmul(attn.reshape(T, H * dv), w.wo, o)  # [T, n_embd]
    if batch.lora is not None:
        batch.lora.add((il, "wo"), attn.reshape(T, H * dv), o)
    if w.bo is not None:
        be.add_bias(o, w.bo)
    if w.post_norm is not None:
        be.rmsnorm(o, w.post_norm, cfg.rms_eps, o)
    if cfg.residual_scale != 1.0:
        o = be.scale(o, cfg.residual_scale)
    be.add(x, o)


def temperature_scaled(be: Backend, cfg: ModelConfig, q: Any, positions: np.ndarray) -> Any:
    """q [T, H, d] with each token's row times llama.cpp's attention temperature at its position
    (llm_graph_input_attn_temp: the float32 position, the rest in double, stored as float32). A host round
    trip: the scale is per token, which no backend kernel takes (a few KB per layer)."""
    pos = positions.astype(np.float32) + np.float32(cfg.attn_temp_offset)
    steps = np.floor(pos / np.float32(cfg.attn_temp_floor)).astype(np.float64)
    scale = (np.log(steps + 1.0) * np.float64(np.float32(cfg.attn_temp_scale)) + 1.0).astype(np.float32)
    host = be.to_host(q) * scale[:, None, None]
    return be.from_host(np.ascontiguousarray(host, np.float32))


def window_from_token(be: Backend, q: Any, attn: Any, batch: ForwardBatch, window: int, call: tuple) -> None:
    """A non-causal image's tokens in a sliding-window layer: the kernel measured the window from each
    token's causal limit (the image's end) where llama.cpp measures it from the token, so a token whose
    window reaches back past the limit's is computed again alone, with the window widened by its
    distance to the limit: keys pos - window + 1 .. limit, as llama.cpp's mask has them. q: [T, H, d];
    attn: [T, H, dv], rows rewritten; call: be.attention's (kv, layer, block_tables, seq_index, limits)
    and (scale, softcap, sinks)."""
    (kv, kl, tables, seq_index, limits), (scale, cap, sinks) = call
    pos, lim = batch.positions, batch.attn_positions  # host copies: [T] int32
    for t in np.nonzero((lim > pos) & (lim - window + 1 > 0))[0]:
        sl = slice(int(t), int(t) + 1)
        one = be.empty((1, *attn.shape[1:]))
        wide = window + int(lim[t] - pos[t])
        be.attention(
            be.contiguous(q[sl]), kv, kl, tables, seq_index[sl], limits[sl], wide, scale, one, cap, sinks
        )
        attn[sl] = one


def feed_forward_block(
    be: Backend, cfg: ModelConfig, w: FeedForwardWeights, x: Any, T: int, lora: Any = None, il: int = 0
) -> None:
    """x += FFN(norm(x)): a gated FFN (SwiGLU or GeGLU), or W_down @ gelu(W_up h) without a gate
    (StarCoder 2, GPT-2). x: [T, n_embd]. lora: the step's LoraStep (il: this layer) or None."""
    h = pre_norm(be, cfg, w.norm, x, T, w.norm_b)
    gate_up = be.empty((T, (2 if cfg.gated_ffn else 1) * cfg.n_ff))
    be.matmul(h, w.w_gate_up, gate_up)  # [T, 2*n_ff] gate|up, or [T, n_ff] up
    if lora is not None:
        lora.add((il, "gate_up"), h, gate_up)
    if w.b_gate_up is not None:
        be.add_bias(gate_up, w.b_gate_up)
    if cfg.gated_ffn:
        act = be.empty((T, cfg.n_ff))
        be.gated_act(gate_up, act, cfg.activation)  # [T, n_ff]
    else:
        act = gate_up
        be.gelu(act)  # the one ungated activation llama.cpp's StarCoder 2 and GPT-2 use
    out = be.empty((T, cfg.n_embd))
    be.matmul(act, w.w_down, out)
    if lora is not None:
        lora.add((il, "down"), act, out)
    if w.b_down is not None:
        be.add_bias(out, w.b_down)
    if w.post_norm is not None:
        be.rmsnorm(out, w.post_norm, cfg.rms_eps, out)
    if cfg.residual_scale != 1.0:
        out = be.scale(out, cfg.residual_scale)
    be.add(x, out)


def weight_bytes_per_token(model: Any, all_experts: bool = False) -> int:
    """Bytes of weights one decode step streams: every matmul once (tied output counted once); of a
    mixture of experts the router, any shared expert and the n_expert_used experts a token selects (their
    file bytes), or every expert with all_experts (what the model holds)."""
    seen, total = set(), 0
    mats = model.weight_matrices() if hasattr(model, "weight_matrices") else [model.output]  # an encoder
    for attn, ffn in model.layers:
        mats += attn.matrices if hasattr(attn, "matrices") else [attn.wqkv, attn.wo]  # LFM2's short conv
        if hasattr(ffn, "experts"):  # arch/moe.py
            mats += [m for m in (ffn.router, ffn.shared_gate_up, ffn.shared_down) if m is not None]
            total += ffn.total_expert_bytes if all_experts else ffn.active_bytes * model.cfg.n_expert_used
        else:
            mats += [ffn.w_gate_up, ffn.w_down]
    for w in mats:
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += sum(p.nbytes for p in getattr(w, "parts", [w]))
    return total
