"""The mixture-of-experts feed-forward block (qwen3moe, qwen2moe, olmoe, Mixtral-style llama), as
llama.cpp's build_moe_ffn computes it:

    h = rmsnorm(x) * ffn_norm                          # [T, n_embd]
    p = softmax(W_router h)                            # [T, n_expert] router probabilities
    sel = top-k(p), w = p[sel]                         # [T, k]; w / sum(w) where the architecture says
    x += sum_s w[:, s] * W_down[sel_s] @ (silu(W_gate[sel_s] h) * (W_up[sel_s] h))   # slot order
    (Qwen 2 MoE, then + sigmoid(w_shexp . h) * FFN_shexp(h): a shared expert every token runs, its gate a
    row stacked under the router's, its output summed as one more slot)
    (gpt-oss: the router's logits biased, sel = top-k of the logits and w = softmax over those k, each
    expert's matrices biased, swiglu_oai in place of silu: arch/gpt_oss.py)

Expert-grouped execution: the step's (token, slot) pairs are sorted by expert, and each selected expert
runs one gate|up and one down matmul over all its tokens (the backend's matmul, so each expert's weights
are read once per step and unselected experts not at all); the outputs land in expert order in one buffer
and are summed back per token in slot order, weighted by the router (Backend.moe_combine). A token's result
depends on its own row only (the kernels are batch-invariant), not on the other tokens of the step.

The expert tensors ([n_expert, rows, cols], the file's own types) stay in the file's mapping; an expert's
slices are prepared with the backend's 2-D `load_matrix` (the same repacking as a dense matrix) the first
time a token selects it, so experts nothing routes to are never read; or all at load (prepare_experts,
what the engine does unless EngineConfig.lazy_experts): preparing an expert costs several times what a
token's pass over it does, and a few prompts select nearly every expert of every layer anyway.
A backend may run the whole block in one call (Backend.moe_block) with the same bits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.arch.common import TensorSource, pre_norm
from edgellm.gguf.model_config import ModelConfig
from edgellm.gguf.reader import TensorInfo, release_mapped_pages

if TYPE_CHECKING:
    from edgellm.backends.base import Backend, ExpertRoute


def expert_slice(t: TensorInfo, e: int) -> TensorInfo:
    """Expert e of a 3-D expert tensor [n_expert, rows, cols] as a 2-D tensor of the file: a view of the
    mapped rows, not a copy."""
    n_expert, rows = t.shape[0], t.shape[1]
    n_bytes = t.n_bytes // n_expert
    return dataclasses.replace(
        t,
        name=f"{t.name}[{e}]",
        shape=tuple(t.shape[1:]),
        offset=t.offset + e * n_bytes,
        n_bytes=n_bytes,
        data=t.data[e * rows : (e + 1) * rows],  # [rows, row_bytes]
    )


class ExpertMatrices:
    """One layer's experts: the file's 3-D gate, up and down tensors, each expert's (gate|up, down)
    matrices prepared by the backend on first use."""

    def __init__(self, be: Backend, gate: TensorInfo, up: TensorInfo, down: TensorInfo) -> None:
        self.be = be
        self.gate, self.up, self.down = gate, up, down  # [E, n_ff_exp, n_embd] x2, [E, n_embd, n_ff_exp]
        self.n_expert = gate.shape[0]
        self._prepared: list[tuple[Any, Any] | None] = [None] * self.n_expert
        # gpt-oss: per-expert biases, host float32 [E, 2 * n_ff_exp] gate|up and [E, n_embd] down (small:
        # loaded whole); each expert's rows go to the backend with its matrices
        self.bias_gate_up: np.ndarray | None = None
        self.bias_down: np.ndarray | None = None
        self._biases: list[tuple[Any, Any] | None] = [None] * self.n_expert
        self.backend_state: Any = None  # the backend's own form of the prepared experts (moe_experts)

    def biases(self, e: int) -> tuple[Any, Any]:
        """(b_gate_up [2 * n_ff_exp], b_down [n_embd]) of expert e, backend vectors; (None, None) without."""
        if self.bias_gate_up is None or self.bias_down is None:
            return None, None
        b = self._biases[e]
        if b is None:
            b = (self.be.from_host(self.bias_gate_up[e]), self.be.from_host(self.bias_down[e]))
            self._biases[e] = b
        return b

    def get(self, e: int) -> tuple[Any, Any]:
        """(w_gate_up [2 * n_ff_exp, n_embd], w_down [n_embd, n_ff_exp]) of expert e."""
        if self._prepared[e] is None:
            self._prepare([e])
        return self._prepared[e]

    def prepare_all(self) -> None:
        """Every expert's matrices now, rather than on first use (get)."""
        self._prepare([e for e in range(self.n_expert) if self._prepared[e] is None])

    def _prepare(self, experts: list[int]) -> None:
        """The experts' gate|up and down matrices, each kind in one pass over them (Backend.load_matrices)."""
        slices = [[expert_slice(t, e) for t in (self.gate, self.up, self.down)] for e in experts]
        gate_up = self.be.load_matrices([s[:2] for s in slices])
        down = self.be.load_matrices([s[2:] for s in slices])
        for e, s, gu, dn in zip(experts, slices, gate_up, down, strict=True):
            self._prepared[e] = (gu, dn)
            for t in s:  # prepared: its file pages out of RSS (a read would refault them)
                release_mapped_pages(t.data)

    @property
    def expert_bytes(self) -> int:
        """File bytes of one expert's three matrices (what a token routed to it reads)."""
        return (self.gate.n_bytes + self.up.n_bytes + self.down.n_bytes) // self.n_expert

    @property
    def n_prepared(self) -> int:
        return sum(w is not None for w in self._prepared)


@dataclass
class MoeFeedForwardWeights:
    norm: Any  # [n_embd]
    router: Any  # [n_expert, n_embd] (ffn_gate_inp); [n_expert + 1, n_embd] with the shared expert's gate
    experts: ExpertMatrices
    shared_gate_up: Any = None  # [2 * n_ff_shexp, n_embd] the shared expert's gate|up (Qwen 2 MoE)
    shared_down: Any = None  # [n_embd, n_ff_shexp]
    post_norm: Any = None  # no MoE architecture here has one
    router_b: np.ndarray | None = None  # [n_expert] host float32, added to the router's logits (gpt-oss)
    # [n_expert] host float32 (exp_probs_b.bias, GLM-4.5 / DeepSeek V3): added to the sigmoid gating's
    # probabilities to choose the experts, not to weight them
    selection_bias: np.ndarray | None = None

    @property
    def active_bytes(self) -> int:
        """Expert bytes one token reads (its n_expert_used experts; the router is a matrix of its own)."""
        return self.experts.expert_bytes

    @property
    def total_expert_bytes(self) -> int:
        return self.experts.expert_bytes * self.experts.n_expert


def load_moe_feed_forward(
    be: Backend, src: TensorSource, cfg: ModelConfig, il: int, norm: str = "ffn_norm.weight"
) -> MoeFeedForwardWeights:
    """Layer il's router and experts (with their biases where the file has them: gpt-oss); `norm`: the
    name of the FFN's pre-norm in the layer (gpt-oss calls it post_attention_norm)."""
    p = f"blk.{il}."
    e, E, fe = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp
    gate = src.get(p + "ffn_gate_exps.weight", (E, fe, e))
    up = src.get(p + "ffn_up_exps.weight", (E, fe, e))
    down = src.get(p + "ffn_down_exps.weight", (E, e, fe))
    router = [src.get(p + "ffn_gate_inp.weight", (E, e))]
    w = MoeFeedForwardWeights(
        norm=be.load_vector(src.get(p + norm, (e,))),
        router=None,
        experts=ExpertMatrices(be, gate, up, down),
    )
    if src.has(p + "ffn_gate_inp.bias"):
        w.router_b = be.to_host(be.load_vector(src.get(p + "ffn_gate_inp.bias", (E,)))).copy()  # [E]
    bias_names = [p + f"ffn_{m}_exps.bias" for m in ("gate", "up", "down")]
    if any(src.has(n) for n in bias_names):  # all three or none (validation.py requires them for gpt-oss)
        gb, ub, db = (
            be.to_host(be.load_vector(src.get(n, (E, rows)))).reshape(E, rows)
            for n, rows in zip(bias_names, (fe, fe, e), strict=True)
        )
        w.experts.bias_gate_up = np.ascontiguousarray(np.concatenate([gb, ub], axis=1), np.float32)
        w.experts.bias_down = np.ascontiguousarray(db, np.float32)
    if src.has(p + "exp_probs_b.bias"):
        w.selection_bias = be.to_host(be.load_vector(src.get(p + "exp_probs_b.bias", (E,)))).copy()  # [E]
    if cfg.n_ff_shexp:
        fs = cfg.n_ff_shexp
        if cfg.shared_expert_gate:
            shared_gate = src.get(p + "ffn_gate_inp_shexp.weight", (e,))  # [n_embd]: one more router row
            router.append(dataclasses.replace(shared_gate, shape=(1, e)))
        w.shared_gate_up = be.load_matrix(
            [src.get(p + "ffn_gate_shexp.weight", (fs, e)), src.get(p + "ffn_up_shexp.weight", (fs, e))]
        )
        w.shared_down = be.load_matrix([src.get(p + "ffn_down_shexp.weight", (e, fs))])
    w.router = be.load_matrix(router)
    return w


def prepare_experts(model: Any) -> int:
    """Prepare every expert of every mixture-of-experts layer of `model` (an ARCHITECTURES model); returns
    how many experts that was (0 for a dense model)."""
    n = 0
    for _, ffn in model.layers:
        if isinstance(ffn, MoeFeedForwardWeights):
            ffn.experts.prepare_all()
            n += ffn.experts.n_expert
    return n


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """float32 softmax of each row of x, computed in float64 (its sum accumulated left to right)."""
    z = x.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    return (z / np.cumsum(z, axis=1)[:, -1:]).astype(np.float32)


def route_softmax_weight(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's SOFTMAX_WEIGHT gating (gpt-oss): the k largest logits (ties to the lower id), weighted
    by a softmax over those k alone. logits: [T, n_expert] float32 -> (experts [T, k] int64, weights [T, k]
    float32). Row by row."""
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    weights = _softmax_rows(np.take_along_axis(logits, experts, axis=1))  # [T, k]
    return experts.astype(np.int64), np.ascontiguousarray(weights, np.float32)


def route_top_k(logits: np.ndarray, k: int, renormalise: bool) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's softmax gating: (experts [T, k] int64, most probable first, ties to the lower id;
    weights [T, k] float32: their softmax probabilities, divided by their sum when `renormalise` (summed
    in float64 left to right, as ggml_sum_rows)). logits: [T, n_expert] float32. Row by row: a token's
    choice depends on its own logits only."""
    probs = _softmax_rows(logits)  # [T, n_expert]
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, axis=1)  # [T, k]
    if renormalise:
        weights = weights / np.cumsum(weights, axis=1, dtype=np.float64)[:, -1:].astype(np.float32)
    return experts.astype(np.int64), np.ascontiguousarray(weights, np.float32)


def route_biased(
    logits: np.ndarray, k: int, cfg: ModelConfig, selection_bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """build_moe_ffn's routing with what route_top_k lacks (GLM-4.5, DeepSeek V2/V3): p = sigmoid(logits)
    in float32 (cfg.moe_gating "sigmoid") or their softmax; the choice by p + selection_bias (exp_probs_b)
    where given, restricted to the cfg.n_group_used expert groups of largest top-2 sum where the experts
    come in cfg.n_expert_groups > 1 groups; weights p of the chosen (ties to the lower id), divided by their
    sum (clamped below at 2^-14) when cfg.moe_norm_weights, times cfg.moe_weights_scale (0 or 1: none).
    logits: [T, n_expert] float32 -> (experts [T, k] int64, weights [T, k] float32)."""
    if cfg.moe_gating == "sigmoid":
        one = np.float32(1.0)
        probs = (one / (one + np.exp(-logits.astype(np.float32)))).astype(np.float32)  # [T, n_expert]
    else:
        probs = _softmax_rows(logits)
    chooser = probs if selection_bias is None else probs + selection_bias.astype(np.float32)
    if cfg.moe_select_by_logits:  # Llama 4: the top k of the logits, the sigmoid only for the weights
        chooser = logits
    T, E = chooser.shape
    G = cfg.n_expert_groups
    if G > 1:  # DeepSeek V3's group-limited choice
        groups = chooser.reshape(T, G, E // G)
        top2 = -np.sort(-groups, axis=2)[:, :, :2]
        scores = top2[:, :, 0] + top2[:, :, 1]  # [T, G], float32 as ggml_sum_rows of two
        kept = np.argsort(-scores, axis=1, kind="stable")[:, : cfg.n_group_used]
        mask = np.full((T, G), True)
        np.put_along_axis(mask, kept, False, axis=1)
        chooser = np.where(np.repeat(mask, E // G, axis=1), np.float32(-np.inf), chooser)
    experts = np.argsort(-chooser, axis=1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, experts, axis=1)  # [T, k]
    if cfg.moe_norm_weights:
        total = np.cumsum(weights, axis=1, dtype=np.float64)[:, -1:].astype(np.float32)
        weights = weights / np.maximum(total, np.float32(6.103515625e-5))
    if cfg.moe_weights_scale not in (0.0, 1.0):
        weights = weights * np.float32(cfg.moe_weights_scale)
    return experts.astype(np.int64), np.ascontiguousarray(weights, np.float32)


# cfg.moe_gating -> (logits [T, E], k, renormalise) -> (experts [T, k], weights [T, k]); gpt-oss's
# softmax over the selected logits already sums to 1 (llama.cpp's norm_w is off for it)
ROUTERS = {
    "softmax": route_top_k,
    "softmax_weight": lambda logits, k, renormalise: route_softmax_weight(logits, k),
}


def group_by_expert(experts: np.ndarray, weights: np.ndarray) -> ExpertRoute:
    """The step's (token, slot) pairs sorted by expert (stable: ascending tokens within an expert).
    experts, weights: [T, k]."""
    from edgellm.backends.base import ExpertRoute  # the arch files import no backend at load (registry.py)

    T, k = experts.shape
    flat = experts.reshape(-1)
    order = np.argsort(flat, kind="stable")  # [T*k]
    sorted_ids = flat[order]
    starts = np.flatnonzero(np.diff(sorted_ids, prepend=-1))  # each run's first row
    where = np.empty(T * k, np.int64)
    where[order] = np.arange(T * k)
    return ExpertRoute(
        experts, weights, order // k, sorted_ids[starts], np.append(starts, T * k), where.reshape(T, k)
    )


def _expert_ffn(
    be: Backend,
    cfg: ModelConfig,
    x: Any,
    w: tuple[Any, Any],
    width: int,
    out: Any,
    b: tuple[Any, Any] = (None, None),
) -> None:
    """out = W_down @ act(W_gate x + b_gate, W_up x + b_up) + b_down, w = (W_gate|W_up, W_down) of FFN
    width `width`, b = (b_gate|b_up, b_down) or Nones; act: cfg.activation's gated form (silu(g) * u, or
    gpt-oss's swiglu_oai). x: [n, n_embd]; out: [n, n_embd]."""
    w_gate_up, w_down = w
    n = x.shape[0]
    gate_up = be.empty((n, 2 * width))
    be.matmul(x, w_gate_up, gate_up)  # [n, 2*width]
    if b[0] is not None:
        be.add_bias(gate_up, b[0])
    act = be.empty((n, width))
    be.gated_act(gate_up, act, cfg.activation)  # [n, width]
    be.matmul(act, w_down, out)  # [n, n_embd]
    if b[1] is not None:
        be.add_bias(out, b[1])


def moe_feed_forward_block(be: Backend, cfg: ModelConfig, w: MoeFeedForwardWeights, x: Any, T: int) -> None:
    """x += MoE-FFN(norm(x)) (module doc). x: [T, n_embd]."""
    if T == 0 or be.moe_block(x, w, cfg):  # the whole block in one call where the backend can
        return
    E, k = cfg.n_expert, cfg.n_expert_used
    shared = w.shared_down is not None
    gated = shared and cfg.shared_expert_gate  # the shared expert's gate: one more router row
    h = pre_norm(be, cfg, w.norm, x, T)  # [T, n_embd]
    logits = be.empty((T, E + gated))
    be.matmul(h, w.router, logits)  # [T, n_expert (+1: the shared expert's gate)]
    host_logits = be.to_host(logits)
    routed = np.ascontiguousarray(host_logits[:, :E])  # [T, n_expert]
    if w.router_b is not None:
        routed = routed + w.router_b  # float32, as ggml_add
    biased = w.selection_bias is not None or cfg.n_expert_groups > 1 or cfg.moe_weights_scale not in (0, 1)
    biased = biased or cfg.moe_select_by_logits
    if cfg.moe_gating == "sigmoid" or biased:  # numpy's routing (the backends' has none of these)
        route = group_by_expert(*route_biased(routed, k, cfg, w.selection_bias))
    else:
        route = be.moe_route(routed, k, cfg.moe_gating, cfg.moe_norm_weights)
    if route is None:
        route = group_by_expert(*ROUTERS[cfg.moe_gating](routed, k, cfg.moe_norm_weights))
    where, weights = route.where, route.weights  # [T, k]
    outs = be.empty((T * (k + shared), cfg.n_embd))  # each pair's expert output, in expert order
    if cfg.moe_weight_before_ffn:  # Llama 4: each pair's input times its weight, its output summed as is
        pair_weights = np.empty(T * k, np.float32)
        pair_weights[where.reshape(-1)] = weights.reshape(-1)  # [T*k] in expert order
        for e, start, end in route.runs:
            xe = be.to_host(be.take_rows(h, route.tokens[start:end])) * pair_weights[start:end, None]
            _expert_ffn(be, cfg, be.from_host(np.ascontiguousarray(xe, np.float32)), w.experts.get(e),
                        cfg.n_ff_exp, outs[start:end], w.experts.biases(e))  # fmt: skip
        weights = np.ones_like(weights)
    elif not be.moe_experts(h, route, w.experts, cfg.activation, outs[: T * k]):
        for e, start, end in route.runs:
            xe = be.take_rows(h, route.tokens[start:end])  # [n, n_embd]: the expert's tokens
            _expert_ffn(be, cfg, xe, w.experts.get(e), cfg.n_ff_exp, outs[start:end], w.experts.biases(e))
    if shared:  # every token, as a last slot weighted by sigmoid(gate) (llama.cpp: silu(g) / g), or 1
        _expert_ffn(be, cfg, h, (w.shared_gate_up, w.shared_down), cfg.n_ff_shexp, outs[T * k :])
        if gated:
            g = host_logits[:, E]  # [T]
            with np.errstate(invalid="ignore"):  # g = 0: sigmoid 1/2, where llama.cpp's 0 / 0 is NaN
                gate = np.where(g == 0, np.float32(0.5), (g / (np.float32(1) + np.exp(-g))) / g)  # [T]
        else:  # GLM-4.5, DeepSeek: the shared expert's output added as it is
            gate = np.ones(T, np.float32)
        where = np.concatenate([where, T * k + np.arange(T, dtype=np.int64)[:, None]], axis=1)
        weights = np.concatenate([weights, gate.astype(np.float32)[:, None]], axis=1)  # [T, k + 1]
    out = be.moe_combine(outs, where, weights)  # [T, n_embd]
    if cfg.residual_scale != 1.0:
        out = be.scale(out, cfg.residual_scale)
    be.add(x, out)
