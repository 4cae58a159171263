"""Drawing a token from a whole logits row (plain temperature, top-p, min-p) without sorting the vocabulary.

Sorting 49k-262k logits per token costs milliseconds in numpy, as much as a whole decode step of a small
model, and the engine core's kernels wait meanwhile. A draw needs only the set of kept tokens and their
weights, not their order: only the tokens heavy enough to be in the nucleus are sorted, or for a flat row
only the one log-probability bucket the top-p boundary falls in (see kept_tokens).
The kept set is exactly the smallest best-first prefix whose probability reaches top_p (ties by lower id),
as a full stable sort would give; the draw then walks the kept tokens in id order, so the same random
number maps to a different token than a best-first walk would, with the same distribution.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BUCKETS_PER_LOG2 = 64  # bucket width: a factor 2**(1/64) in probability (~1.1%)
N_BUCKETS = 64 * 64  # down to 2**-64 of the best token's probability; all smaller share the last bucket
_LOG2E = 1.4426950408889634


@njit(cache=True, nogil=True)
def _bucket(z: np.float32) -> int:
    """z = (logit - max) / temperature <= 0, or -inf/NaN for tokens that cannot be drawn."""
    v = -z * _LOG2E * BUCKETS_PER_LOG2
    if not v < N_BUCKETS - 1:  # also NaN and inf
        return N_BUCKETS - 1
    return int(v)


@njit(cache=True, nogil=True)
def _kept_by_buckets(z: np.ndarray, e: np.ndarray, top_p: float, min_p: float) -> np.ndarray:
    """kept_tokens by bucketing every token by log-probability (BUCKETS_PER_LOG2 buckets per halving):
    the buckets' masses say which bucket the top-p boundary falls in, and only that bucket is sorted."""
    n = z.shape[0]
    total = 0.0
    bucket = np.full(n, N_BUCKETS, np.int32)  # N_BUCKETS: a token that cannot be drawn
    mass = np.zeros(N_BUCKETS, np.float64)
    for i in range(n):
        if e[i] > 0.0:
            total += e[i]
            bucket[i] = _bucket(z[i])
            mass[bucket[i]] += e[i]
    need = top_p * total if top_p < 1.0 else np.inf
    acc = 0.0
    edge = N_BUCKETS  # buckets below `edge` are kept whole
    for b in range(N_BUCKETS):
        if acc + mass[b] >= need:
            edge = b
            break
        acc += mass[b]
    # The boundary bucket: sort its members best first (ties by lower id) and keep the prefix that
    # reaches top_p.
    cut = -1.0  # members with e > cut, or == cut and id <= cut_id, are kept
    cut_id = n
    if edge < N_BUCKETS:
        members = np.flatnonzero(bucket == edge)
        order = members[np.argsort(-e[members], kind="mergesort")]
        for j in range(order.shape[0]):
            acc += e[order[j]]
            if acc >= need or j == order.shape[0] - 1:
                cut, cut_id = e[order[j]], order[j]
                break
    floor = np.float32(min_p)  # min-p: p >= min_p * p(best) is e >= min_p, since e(best) == 1
    kept = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        b = bucket[i]
        if not e[i] > 0.0 or b > edge or e[i] < floor:
            continue
        if b < edge or (e[i] > cut or (e[i] == cut and i <= cut_id)):
            kept[k] = i
            k += 1
    if k == 0:  # min_p above everything but the best (rounding): the best token alone
        kept[0] = np.argmax(e)
        k = 1
    return kept[:k]


@njit(cache=True, nogil=True, fastmath=True)
def _total(e: np.ndarray) -> float:
    """Sum of e >= 0 in float64, in SIMD lanes (fastmath reorders the adds: a serial chain cost ~60 us
    at 49k)."""
    total = 0.0
    for i in range(e.shape[0]):
        total += e[i]
    return total


@njit(cache=True, nogil=True, fastmath=True)
def _count_at_least(e: np.ndarray, lo: np.float32) -> int:
    """Tokens that can be drawn (e > 0) with e >= lo."""
    m = 0
    for i in range(e.shape[0]):
        m += (e[i] > 0.0) & (e[i] >= lo)
    return m


MAX_SORTED = 2048  # candidates kept_tokens sorts itself; a flatter row goes to the buckets


@njit(cache=True, nogil=True)
def kept_tokens(
    z: np.ndarray, e: np.ndarray, top_p: float, min_p: float, max_sorted: int = MAX_SORTED
) -> np.ndarray:
    """Ids (ascending) of the tokens top-p and min-p keep. z: float32 [V] scaled logits minus their max;
    e: float32 [V] exp(z), 0 for tokens that cannot be drawn.
    Tokens under t = (total - need) / V hold less than total - need between them, so those at or above t
    hold more than need = top_p * total: the best-first prefix that reaches it lies among them. A peaked
    row (what a model mostly gives) has tens of such tokens, sorted here; a flat one, up to the whole
    vocabulary, goes to the buckets, which never sort more than one bucket."""
    n = e.shape[0]
    total = _total(e)
    floor = np.float32(min_p)  # min-p: p >= min_p * p(best) is e >= min_p, since e(best) == 1
    need = top_p * total if top_p < 1.0 else np.inf
    t = np.float32((total - need) / n * 0.999) if top_p < 1.0 else np.float32(0.0)
    lo = max(t, floor)
    m = _count_at_least(e, lo)
    if m > max_sorted:
        return _kept_by_buckets(z, e, top_p, min_p)
    cand = np.empty(m, np.int64)
    m = 0
    for i in range(n):
        if e[i] >= lo and e[i] > 0.0:
            cand[m] = i
            m += 1
    if top_p < 1.0 and m > 1:
        # best first, ties by lower id (a stable sort of ascending ids); the prefix that reaches top_p
        order = cand[np.argsort(-e[cand], kind="mergesort")]
        acc = 0.0
        keep = m
        for j in range(m):
            acc += e[order[j]]
            if acc >= need:
                keep = j + 1
                break
        cand = np.sort(order[:keep])
    if cand.shape[0] == 0:  # min_p above everything but the best (rounding): the best token alone
        cand = np.empty(1, np.int64)
        cand[0] = np.argmax(e)
    return cand


@njit(cache=True, nogil=True)
def draw_in_id_order(e: np.ndarray, ids: np.ndarray, r: float) -> int:
    """The token among `ids` whose cumulative weight e (in the order given) first exceeds r * total."""
    total = 0.0
    for j in range(ids.shape[0]):
        total += e[ids[j]]
    target = r * total
    acc = 0.0
    for j in range(ids.shape[0]):
        acc += e[ids[j]]
        if acc > target:
            return ids[j]
    return ids[ids.shape[0] - 1]


@njit(cache=True, nogil=True)
def draw_from_row(e: np.ndarray, r: float) -> int:
    """The token whose cumulative weight e (in id order) first exceeds r * total: plain temperature sampling
    over the whole row."""
    total = 0.0
    last = 0
    for i in range(e.shape[0]):
        if e[i] > 0.0:
            total += e[i]
            last = i
    target = r * total
    acc = 0.0
    for i in range(e.shape[0]):
        if e[i] > 0.0:
            acc += e[i]
            if acc > target:
                return i
    return last


def scaled_row(logits: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """z = (logits - max) / temperature and e = exp(z), float32 [V] each (numpy's SIMD exp: ~20 us at
    49k, where float64 took ~300 us). -inf logits get e == 0; NaN logits are never drawn."""
    x = np.asarray(logits, dtype=np.float32)
    top = x.max()  # NaN if any logit is NaN, inf if any is +inf: the careful path below
    if np.isfinite(top):
        z = x - top
        z *= np.float32(1.0 / temperature)
        return z, np.exp(z)
    finite = np.isfinite(x)
    if not finite.any():
        raise ValueError("no token can be sampled: every logit is -inf or NaN")
    x = np.where(x == np.inf, np.float32(np.finfo(np.float32).max), x)
    finite_max = x[np.isfinite(x)].max()
    with np.errstate(invalid="ignore", over="ignore"):
        z = (x - finite_max) * np.float32(1.0 / temperature)
        e = np.exp(z)
    e[~(e > 0)] = 0.0  # NaN logits
    return z, e
