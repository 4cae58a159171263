"""A mixture-of-experts feed-forward block in one Numba call (CpuBackend.moe_block).

arch/moe.py runs the block as six backend calls a layer (the pre-norm, the router's matmul, the routing,
the experts, the weighted sum, the residual add), each with its Python dispatch and its checks of small
arrays: ~50 us a layer at one token, more than a millisecond of a 24-layer decode step. Here the same
compiled functions run in that order inside one call, so every output has the bits of the six calls
(tests/kernels/test_moe_experts.py). It covers the blocks whose every step has a compiled form: an RMS
pre-norm, a float32 router without bias, no shared expert, the gatings of moe_route and the activations of
moe_experts, every expert prepared in its tile form. Anything else goes the six-call way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from edgellm.backends.cpu.matmul import ORDERED_MATH, matmul_dense_f32_cpu
from edgellm.backends.cpu.moe.experts import (
    MOE_ACTIVATIONS,
    ExpertTiles,
    layer_tiles,
    moe_combine_cpu,
    moe_experts_cpu,
)
from edgellm.backends.cpu.moe.route import GATINGS, moe_route_cpu
from edgellm.backends.cpu.numba_cache import follow_sources
from edgellm.backends.cpu.ops import add_cpu, rmsnorm_cpu
from edgellm.quants.packing import PackedWeight


@njit(cache=True, nogil=True, fastmath=ORDERED_MATH)
def moe_block_cpu(
    x, norm_w, eps, router, k, gating, renormalise, gu_at_all, gu_meta, dn_at_all, dn_meta, activation,
    n_threads, tier,
) -> None:  # fmt: skip
    """x += MoE-FFN(rmsnorm(x) * norm_w) (arch/moe.py's moe_feed_forward_block). x [T, n_embd]; norm_w
    [n_embd]; router [n_expert, n_embd] float32; gu_at_all / dn_at_all int64 [n_expert, PARTS, 6, 2] every
    expert's plane addresses (ExpertTiles); gating / activation: GATINGS' / MOE_ACTIVATIONS' codes. The
    caller has checked every shape (run_moe_block)."""
    n_tokens, n_embd = x.shape
    h = np.empty((n_tokens, n_embd), np.float32)  # [T, n_embd]
    rmsnorm_cpu(x, norm_w, eps, h)
    logits = np.empty((n_tokens, router.shape[0]), np.float32)  # [T, n_expert]
    matmul_dense_f32_cpu(h, router, logits)
    _, weights, tokens, ids, bounds, where = moe_route_cpu(logits, k, gating, renormalise)
    n_runs = ids.shape[0]
    gu_at = np.empty((n_runs, gu_at_all.shape[1], 6, 2), np.int64)  # the runs' experts, in run order
    dn_at = np.empty((n_runs, dn_at_all.shape[1], 6, 2), np.int64)
    for r in range(n_runs):
        gu_at[r] = gu_at_all[ids[r]]
        dn_at[r] = dn_at_all[ids[r]]
    outs = np.empty((n_tokens * k, n_embd), np.float32)  # [T*k, n_embd]: each pair's output, in run order
    no_bias = np.zeros((0, 0), np.float32)
    moe_experts_cpu(
        h, tokens, bounds, gu_at, gu_meta, dn_at, dn_meta, no_bias, no_bias, activation, n_threads, tier, outs
    )
    out = np.empty((n_tokens, n_embd), np.float32)
    moe_combine_cpu(outs, where, weights, out)  # the route's rows: always inside outs
    add_cpu(x, out)


follow_sources(moe_block_cpu)  # its code holds the tile kernels' IR


def complete_expert_tiles(experts: Any) -> ExpertTiles | None:
    """The layer's ExpertTiles (moe_experts.layer_tiles) holding every expert, or None while some expert is
    not prepared yet (EngineConfig.lazy_experts: they are prepared as tokens reach them, by the six-call
    path) or one has no tile form."""
    state = layer_tiles(experts)
    if state is None or state.ready.all():
        return state
    if experts.n_prepared < experts.n_expert or not state.fill(experts, np.arange(experts.n_expert)):
        return None
    return state


def run_moe_block(x: np.ndarray, w: Any, cfg: Any, n_threads: int, tier: int) -> bool:
    """CpuBackend.moe_block on a tile tier: x += the block of w (an arch.moe.MoeFeedForwardWeights) in one
    moe_block_cpu call; False (nothing done) where some step has no compiled form here."""
    gating, activation = GATINGS.get(cfg.moe_gating), MOE_ACTIVATIONS.get(cfg.activation)
    router, norm = w.router, w.norm
    if (
        gating is None or activation is None or cfg.layer_norm or cfg.residual_scale != 1.0
        or w.shared_down is not None or w.router_b is not None or w.post_norm is not None or norm is None
        or w.experts.bias_gate_up is not None
        or not isinstance(router, PackedWeight) or router.dense is None or router.act_round is not None
    ):  # fmt: skip
        return False
    n_expert, n_embd, k = w.experts.n_expert, cfg.n_embd, cfg.n_expert_used
    if (
        x.ndim != 2 or x.shape[1] != n_embd or x.dtype != np.float32 or not x.flags.c_contiguous
        or router.dense.shape != (n_expert, n_embd) or router.dense.dtype != np.float32
        or not router.dense.flags.c_contiguous
        or norm.shape != (n_embd,) or norm.dtype != np.float32 or not 1 <= k <= n_expert
        or w.experts.gate.shape[2] != n_embd
    ):  # fmt: skip
        return False
    state = complete_expert_tiles(w.experts)
    if state is None:
        return False
    moe_block_cpu(
        x, norm, float(cfg.rms_eps), router.dense, k, gating, cfg.moe_norm_weights, state.gu_at,
        state.gu_meta, state.dn_at, state.dn_meta, activation, n_threads, tier,
    )  # fmt: skip
    return True
