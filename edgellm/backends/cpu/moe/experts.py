"""A mixture-of-experts layer's routed experts in one Numba call (CpuBackend.moe_experts).

arch/moe.py groups the step's (token, slot) pairs by expert. Run expert by expert from Python, a decode
step of a 24-layer, top-8 model makes ~400 small kernel calls, each with its own parallel region (two
threads woken and joined) and its Python dispatch; with weights of ~1-2 MB per expert matrix the
launches cost as much as the streaming. Here the layer's selected experts run as two parallel regions:
every expert's gate|up over its tokens, then every expert's down, the (expert, tile) pairs of each split
between the threads (vnni.matmul_tiles_runs_at_cpu). Each output is computed by the tile kernel exactly
as CpuBackend.matmul computes it (the activations quantized row by row, the same tile calls), so the
results are bit for bit those of the per-expert path (tests/kernels/test_moe_experts.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from edgellm.backends.base import ExpertRoute
from edgellm.backends.cpu.layer import PARTS, pack_matrix
from edgellm.backends.cpu.matmul import ORDERED_MATH, quantize_act_rows_cpu
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.ops import swiglu_oai_par_cpu
from edgellm.backends.cpu.silu_ir import swiglu_vec_cpu, swiglu_vec_par_cpu
from edgellm.backends.cpu.vnni import matmul_tiles_runs_at_cpu


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def _runs_matmul(x, at, meta, bounds, out, n_threads, tier) -> None:
    """out[a:b, part columns] = x[a:b] @ part_r.T for each part of run r's matrix (a, b = bounds[r],
    bounds[r + 1]). at: int64 [R, PARTS, 6, 2] each run's plane addresses; meta: int64 [PARTS, META],
    the same for every run."""
    for p in range(PARTS):
        rows = meta[p, 4]
        if rows == 0:
            continue
        c0 = meta[p, 5]
        xq, xs, xsum, xisum = quantize_act_rows_cpu(x, meta[p, 1], meta[p, 2])
        matmul_tiles_runs_at_cpu(
            xq, xs, xsum, xisum, at[:, p], bounds, meta[p, 6], meta[p, 0], meta[p, 3], rows, n_threads, tier,
            out[:, c0 : c0 + rows],
        )  # fmt: skip


# the gated activations moe_experts_cpu runs (the kinds CpuBackend.gated_act takes; others: expert by expert)
MOE_ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}
NO_BIAS = np.zeros((0, 0), np.float32)  # moe_experts_cpu's bias arguments for experts without biases


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def _add_run_bias(y, bounds, bias) -> None:
    """y[i] += bias[r] for the pairs i of run r (CpuBackend.add_bias's float32 adds)."""
    for r in range(bounds.shape[0] - 1):
        for i in range(bounds[r], bounds[r + 1]):
            for j in range(y.shape[1]):
                y[i, j] += bias[r, j]


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def moe_experts_cpu(
    h, tokens, bounds, gu_at, gu_meta, dn_at, dn_meta, gu_bias, dn_bias, activation, n_threads, tier, outs
) -> None:
    """outs[i] = W_down_r @ act(W_gate_r x + bg_r, W_up_r x + bu_r) + bd_r, x = h[tokens[i]], for the pairs
    i of run r (bounds[r] <= i < bounds[r + 1]). h [T, n_embd]; tokens [P] int64; bounds [R + 1] int64;
    gu_at / dn_at int64 [R, PARTS, 6, 2], gu_meta / dn_meta int64 [PARTS, META]; gu_bias [R, 2 * n_ff_exp]
    and dn_bias [R, n_embd] float32, or [0, 0] for none; activation: MOE_ACTIVATIONS' code; outs [P,
    n_embd]. The caller has checked every shape and index."""
    n_pairs = tokens.shape[0]
    xe = np.empty((n_pairs, h.shape[1]), np.float32)  # [P, n_embd]: each pair's token, in run order
    for i in range(n_pairs):
        xe[i, :] = h[tokens[i]]
    width2 = 0
    for p in range(PARTS):
        width2 += gu_meta[p, 4]
    gate_up = np.empty((n_pairs, width2), np.float32)  # [P, 2 * n_ff_exp]
    _runs_matmul(xe, gu_at, gu_meta, bounds, gate_up, n_threads, tier)
    if gu_bias.shape[0] > 0:
        _add_run_bias(gate_up, bounds, gu_bias)
    act = np.empty((n_pairs, width2 // 2), np.float32)  # [P, n_ff_exp]
    if activation == 1:
        swiglu_oai_par_cpu(gate_up, act)  # always the parallel kernel, as CpuBackend.gated_act
    elif n_pairs >= 8:  # one row's bits whichever runs it (the same row function)
        swiglu_vec_par_cpu(gate_up, act, tier)
    else:
        swiglu_vec_cpu(gate_up, act, tier)
    _runs_matmul(act, dn_at, dn_meta, bounds, outs, n_threads, tier)
    if dn_bias.shape[0] > 0:
        _add_run_bias(outs, bounds, dn_bias)


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def moe_combine_cpu(outs, where, weights, out) -> bool:
    """out[t] = sum over slots s, in slot order, of weights[t, s] * outs[where[t, s]], each product rounded
    to float32 before it is added (Backend.moe_combine's order: no contraction into an FMA). False
    (nothing written) when a row of `where` is outside outs."""
    n_tokens, k = where.shape
    for t in range(n_tokens):
        for s in range(k):
            if where[t, s] < 0 or where[t, s] >= outs.shape[0]:
                return False
    for t in range(n_tokens):
        w0, r0 = weights[t, 0], outs[where[t, 0]]
        for j in range(out.shape[1]):
            out[t, j] = w0 * r0[j]
        for s in range(1, k):
            ws, rs = weights[t, s], outs[where[t, s]]
            for j in range(out.shape[1]):
                out[t, j] += ws * rs[j]
    return True


follow_sources(_runs_matmul, moe_experts_cpu)  # their code holds the tile kernels' IR


class ExpertTiles:
    """One layer's experts as moe_experts_cpu's arguments, filled in as experts are prepared: each
    expert's plane addresses, and the meta every expert shares (its first expert's; the others are
    checked against it)."""

    def __init__(self, n_expert: int) -> None:
        self.gu_at = np.zeros((n_expert, PARTS, 6, 2), np.int64)
        self.dn_at = np.zeros((n_expert, PARTS, 6, 2), np.int64)
        self.gu_meta: np.ndarray | None = None  # [PARTS, META]
        self.dn_meta: np.ndarray | None = None
        self.ready = np.zeros(n_expert, bool)
        self.keep: list = [None] * n_expert  # the Tiles behind the addresses
        self.untiled = False  # an expert without the tile form: this layer runs expert by expert

    def add(self, e: int, w: tuple[Any, Any], width: int, n_embd: int) -> bool:
        """Take expert e's prepared (gate|up, down); False when it has no tile form."""
        gu = pack_matrix(w[0], 2 * width, n_embd, f"expert {e} gate|up")
        dn = pack_matrix(w[1], n_embd, width, f"expert {e} down")
        if gu is None or dn is None:
            self.untiled = True
            return False
        if self.gu_meta is None:
            self.gu_meta, self.dn_meta = gu[1], dn[1]
        elif not (np.array_equal(gu[1], self.gu_meta) and np.array_equal(dn[1], self.dn_meta)):
            self.untiled = True  # experts of different layouts (not in any file seen): the slow path
            return False
        self.gu_at[e], self.dn_at[e] = gu[0], dn[0]
        self.keep[e] = (gu[2], dn[2])
        self.ready[e] = True
        return True

    def fill(self, experts: Any, ids: np.ndarray) -> bool:
        """Add the experts `ids` not in yet (experts.get prepares any not prepared); False when one has no
        tile form."""
        width, n_embd = experts.gate.shape[1], experts.gate.shape[2]
        for e in ids[~self.ready[ids]]:
            if not self.add(int(e), experts.get(int(e)), width, n_embd):
                return False
        return True


def layer_tiles(experts: Any) -> ExpertTiles | None:
    """The ExpertTiles of a layer's experts (arch.moe.ExpertMatrices.backend_state, made on first use), or
    None once one of them proved to have no tile form (the layer then runs expert by expert)."""
    state = experts.backend_state
    if state is None:
        state = experts.backend_state = ExpertTiles(experts.n_expert)
    return None if state.untiled else state


def check_moe_args(
    h: np.ndarray, tokens: np.ndarray, bounds: np.ndarray, outs: np.ndarray, n_embd: int
) -> None:
    """Every shape and index moe_experts_cpu reads unchecked (Numba does no bounds checks)."""
    n_pairs = tokens.shape[0]
    if h.ndim != 2 or h.shape[1] != n_embd or h.dtype != np.float32 or not h.flags.c_contiguous:
        raise ValueError(f"MoE input of shape {h.shape} ({h.dtype}), expected C-contiguous [T, {n_embd}]")
    if outs.shape != (n_pairs, n_embd) or outs.dtype != np.float32 or not outs.flags.c_contiguous:
        raise ValueError(f"MoE outputs of shape {outs.shape}, expected C-contiguous [{n_pairs}, {n_embd}]")
    if n_pairs and (tokens.min() < 0 or tokens.max() >= h.shape[0]):
        raise ValueError(f"MoE token index outside 0..{h.shape[0] - 1}")
    if bounds[0] != 0 or bounds[-1] != n_pairs or np.any(np.diff(bounds) < 0):
        raise ValueError(f"MoE run bounds {bounds.tolist()} do not cover {n_pairs} pairs in order")


def check_moe_runs(ids: np.ndarray, bounds: np.ndarray, n_expert: int) -> None:
    """The runs' experts index the layer's n_expert (state rows read unchecked), one bound per run and the
    end: with fewer, runs would go unread and their outputs unwritten."""
    if bounds.shape != (ids.size + 1,) or (ids.size and (ids.min() < 0 or ids.max() >= n_expert)):
        raise ValueError(f"MoE runs of experts {ids.tolist()}, bounds {bounds.tolist()}: {n_expert} experts")


def check_moe_biases(gu_bias: np.ndarray, dn_bias: np.ndarray, n_runs: int, width: int, n_embd: int) -> None:
    """The per-run bias rows moe_experts_cpu adds unchecked: both [0, 0], or [R, 2 * width], [R, n_embd]."""
    none = gu_bias.shape == (0, 0) and dn_bias.shape == (0, 0)
    if not none and (gu_bias.shape != (n_runs, 2 * width) or dn_bias.shape != (n_runs, n_embd)):
        raise ValueError(
            f"MoE biases of shapes {gu_bias.shape} / {dn_bias.shape}, expected [{n_runs}, {2 * width}] / "
            f"[{n_runs}, {n_embd}]"
        )
    for b in (gu_bias, dn_bias):
        if b.dtype != np.float32 or not b.flags.c_contiguous:
            raise ValueError(f"MoE bias of dtype {b.dtype}, expected C-contiguous float32")


def run_moe_experts(
    h: np.ndarray,
    route: ExpertRoute,
    experts: Any,
    activation: str,
    outs: np.ndarray,
    n_threads: int,
    tier: int,
) -> bool:
    """CpuBackend.moe_experts on a tile tier: the layer's selected experts in one moe_experts_cpu call;
    False (nothing done) for an activation it has no code for or experts without the tile form."""
    code = MOE_ACTIVATIONS.get(activation)
    if code is None:
        return False
    state = layer_tiles(experts)
    if state is None:
        return False
    width, n_embd = experts.gate.shape[1], experts.gate.shape[2]
    ids, tokens, bounds = route.ids, route.tokens, route.bounds  # [R], [T*k], [R + 1]
    check_moe_runs(ids, bounds, experts.n_expert)
    if not state.fill(experts, ids):
        return False
    h = np.ascontiguousarray(h, np.float32)
    check_moe_args(h, tokens, bounds, outs, n_embd)
    gu_bias, dn_bias = NO_BIAS, NO_BIAS
    if experts.bias_gate_up is not None:  # gpt-oss: [E, 2 * width], [E, n_embd] -> the runs' rows
        gu_bias = np.ascontiguousarray(experts.bias_gate_up[ids], np.float32)  # [R, 2 * width]
        dn_bias = np.ascontiguousarray(experts.bias_down[ids], np.float32)  # [R, n_embd]
    check_moe_biases(gu_bias, dn_bias, len(ids), width, n_embd)
    moe_experts_cpu(
        h, tokens, bounds, state.gu_at[ids], state.gu_meta, state.dn_at[ids], state.dn_meta, gu_bias, dn_bias,
        code, n_threads, tier, outs,
    )  # fmt: skip
    return True
