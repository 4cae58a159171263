"""A mixture-of-experts layer's routing in one Numba call (CpuBackend.moe_route).

arch/moe.py's numpy routing (ROUTERS, then group_by_expert) is some twenty small numpy calls a layer:
~50-60 us at one token, 1.5-2.5 ms of a 24-layer decode step that streams its weights in ~45 ms. Here the
same steps run row by row in compiled code: the softmax in float64, its sum left to right, rounded to
float32; the top k by value, ties to the lower id (numpy's stable argsort of the negated values: NaN
last); the renormalising sum in float64 left to right; then a counting sort of the (token, slot) pairs
by expert. Every operation is numpy's but exp, whose float64 result may differ by an ulp between libm
and numpy's SIMD code: the weights agree to float32 rounding and the experts where no two probabilities
are that close (tests/kernels/test_moe_route.py). A row's result depends on its own logits only.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from edgellm.backends.base import ExpertRoute

# cfg.moe_gating -> moe_route_cpu's code (arch/moe.py's ROUTERS)
GATINGS = {"softmax": 0, "softmax_weight": 1}


@njit(cache=True, nogil=True, error_model="numpy")
def _softmax_f64(x, z, p) -> None:
    """p = float32(softmax(float64(x))): the max, exp(x - max), their sum left to right (z: float64
    scratch)."""
    n = x.shape[0]
    m = -np.inf
    nan = False
    for i in range(n):
        v = np.float64(x[i])
        if v != v:
            nan = True
        elif v > m:
            m = v
    if nan:
        m = np.nan
    s = 0.0
    for i in range(n):
        z[i] = math.exp(np.float64(x[i]) - m)
        s += z[i]
    for i in range(n):
        p[i] = np.float32(z[i] / s)


@njit(cache=True, nogil=True, error_model="numpy")
def _top_k(p, k, taken, sel) -> None:
    """sel[:k] = the indices of p's k largest values, largest first, ties to the lower index, NaN last."""
    taken[:] = False
    for s in range(k):
        best = -1
        for e in range(p.shape[0]):
            if taken[e]:
                continue
            if best < 0 or p[e] > p[best] or (p[best] != p[best] and p[e] == p[e]):
                best = e
        taken[best] = True
        sel[s] = best


@njit(cache=True, nogil=True, error_model="numpy")
def moe_route_cpu(logits, k, gating, renormalise):
    """logits: [T, E] float32 -> (experts [T, k], weights [T, k] float32, tokens [T*k], ids [R],
    bounds [R + 1], where [T, k]) as ExpertRoute's fields; gating: GATINGS' code."""
    T, E = logits.shape
    experts = np.empty((T, k), np.int64)
    weights = np.empty((T, k), np.float32)
    z = np.empty(E, np.float64)
    p = np.empty(E, np.float32)
    sel_logits = np.empty(k, np.float32)
    taken = np.empty(E, np.bool_)
    for t in range(T):
        if gating == 0:  # softmax over every expert, the top k of the probabilities
            _softmax_f64(logits[t], z, p)
            _top_k(p, k, taken, experts[t])
            for s in range(k):
                weights[t, s] = p[experts[t, s]]
            if renormalise:
                ws = 0.0
                for s in range(k):
                    ws += np.float64(weights[t, s])
                for s in range(k):
                    weights[t, s] = weights[t, s] / np.float32(ws)
        else:  # the top k of the logits, a softmax over those alone
            _top_k(logits[t], k, taken, experts[t])
            for s in range(k):
                sel_logits[s] = logits[t, experts[t, s]]
            _softmax_f64(sel_logits, z, weights[t])
    start = np.zeros(E + 1, np.int64)  # start[e]: expert e's first row in expert order
    for t in range(T):
        for s in range(k):
            start[experts[t, s] + 1] += 1
    n_runs = 0
    for e in range(E):
        n_runs += start[e + 1] > 0
        start[e + 1] += start[e]
    ids = np.empty(n_runs, np.int64)
    bounds = np.empty(n_runs + 1, np.int64)
    r = 0
    for e in range(E):
        if start[e + 1] > start[e]:
            ids[r] = e
            bounds[r] = start[e]
            r += 1
    bounds[n_runs] = T * k
    tokens = np.empty(T * k, np.int64)
    where = np.empty((T, k), np.int64)
    for t in range(T):  # tokens ascending within each expert
        for s in range(k):
            row = start[experts[t, s]]
            start[experts[t, s]] = row + 1
            tokens[row] = t
            where[t, s] = row
    return experts, weights, tokens, ids, bounds, where


def route_cpu(logits: np.ndarray, k: int, gating: str, renormalise: bool) -> ExpertRoute | None:
    """CpuBackend.moe_route: None for a gating it has no code for."""
    code = GATINGS.get(gating)
    if code is None:
        return None
    if logits.ndim != 2 or logits.dtype != np.float32 or not logits.flags.c_contiguous:
        raise ValueError(
            f"router logits of shape {logits.shape} ({logits.dtype}): expected C-contiguous [T, E]"
        )
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"{k} experts per token of {logits.shape[1]}")
    return ExpertRoute(*moe_route_cpu(logits, k, code, renormalise))
