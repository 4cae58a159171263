"""The host sampler without a full sort of the vocabulary: the same tokens as the full-sort algorithm for
top-k (given the same random stream), exactly the full sort's kept set for top-p / min-p and the right
distribution over it and for plain temperature sampling, and top_k_stable equal to argsort's prefix (ties
by lower id, NaN last)."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.sampling.nucleus import MAX_SORTED, kept_tokens, scaled_row
from edgellm.sampling.sampler import PARAM_BOUNDS, Sampler, SamplingParams, top_k_stable


def full_sort_cut(params: SamplingParams, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The previous algorithm's kept tokens, best first, and their probabilities over the whole row (or the
    top-k): a stable argsort of the whole row, then the top-p / min-p cut."""
    x = logits.astype(np.float64) / params.temperature
    order = np.argsort(-x, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    probs = np.exp(x[order] - x[order[0]])
    probs /= probs.sum()
    keep = len(order)
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1)
    if params.min_p > 0.0:
        keep = min(keep, max(1, int(np.count_nonzero(probs >= params.min_p * probs[0]))))
    return order[:keep], probs[:keep]


def full_sort_sample(params: SamplingParams, rng: np.random.Generator, logits: np.ndarray) -> int:
    """The previous algorithm's draw: best first over the kept tokens."""
    order, probs = full_sort_cut(params, logits)
    return int(order[rng.choice(len(order), p=probs / probs.sum())])


def test_top_k_stable_is_argsort_prefix() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.integers(-5, 5, 300).astype(np.float32)  # many ties
        if rng.random() < 0.3:
            x[rng.integers(0, 300, 3)] = np.nan
        k = int(rng.integers(1, 310))
        np.testing.assert_array_equal(top_k_stable(x, k), np.argsort(-x, kind="stable")[:k])


def full_sort_kept(params: SamplingParams, logits: np.ndarray) -> set[int]:
    """The tokens top-p / min-p keep, by a stable sort of the whole row."""
    return set(full_sort_cut(params, logits)[0].tolist())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, seed=1),
        SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02, top_k=100, seed=5),
    ],
    ids=["top_k", "top_k_top_p_min_p"],
)
def test_top_k_sampling_draws_what_the_full_sort_draws(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    sampler = Sampler(params)
    ref_rng = np.random.default_rng(params.seed)
    for _ in range(300):
        logits = (rng.standard_normal(5000) * 3).astype(np.float32)
        assert sampler.sample(logits, [], []) == full_sort_sample(params, ref_rng, logits)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.999),  # a nucleus of thousands of tokens
        SamplingParams(temperature=1.2, min_p=0.05),
        SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02),
        SamplingParams(temperature=0.3, top_p=0.5),
    ],
    ids=["top_p", "top_p_wide", "min_p", "top_p_min_p", "top_p_peaked"],
)
@pytest.mark.parametrize("max_sorted", [0, MAX_SORTED], ids=["buckets", "sorted_candidates"])
def test_top_p_and_min_p_keep_what_the_full_sort_keeps(params: SamplingParams, max_sorted: int) -> None:
    """Both selections (sorting the heavy tokens; the buckets, for flat rows) keep exactly the full sort's
    set, ties at the boundary by lower id included, on peaked and flat rows."""
    rng = np.random.default_rng(7)
    for i in range(200):
        logits = (rng.standard_normal(5000) * (3 if i % 4 < 2 else 0.5)).astype(np.float32)
        if i % 2:
            logits = np.round(logits, 1)  # many exact ties, also at the top-p boundary
        z, e = scaled_row(logits, params.temperature)
        kept = kept_tokens(z, e, params.top_p, params.min_p, max_sorted)
        assert set(kept.tolist()) == full_sort_kept(params, logits)
        assert np.all(np.diff(kept) > 0)


def test_top_p_draws_follow_the_renormalised_nucleus() -> None:
    """Kept tokens are drawn in id order: frequencies match p(token) / p(nucleus) over 40,000 draws."""
    logits = np.array([2.0, 0.5, 1.5, -1.0, 0.0, 1.0, 1.5], np.float32)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=3)
    sampler = Sampler(params)
    counts = np.bincount([sampler.sample(logits, [], []) for _ in range(40000)], minlength=7)
    x = logits.astype(np.float64) / 0.7
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    kept = sorted(full_sort_kept(params, logits))
    want = np.zeros(7)
    want[kept] = p[kept] / p[kept].sum()
    np.testing.assert_allclose(counts / 40000, want, atol=0.01)


def test_masked_and_nan_logits_are_never_drawn() -> None:
    logits = np.array([np.nan, 1.0, -np.inf, 0.5, np.nan], np.float32)
    for params in (
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=1.0, top_p=0.99, seed=2),
        SamplingParams(temperature=1.0, min_p=0.01, seed=3),
    ):
        sampler = Sampler(params)
        assert {sampler.sample(logits, [], []) for _ in range(300)} == {1, 3}
    with pytest.raises(ValueError, match="every logit"):
        Sampler(SamplingParams(temperature=1.0)).sample(np.full(4, -np.inf, np.float32), [], [])


def test_temperature_sampling_follows_the_softmax() -> None:
    """Plain temperature sampling draws in token order: a different mapping from random numbers to tokens
    than a sorted draw, the same distribution (checked by frequencies over 40,000 draws)."""
    logits = np.array([2.0, 0.5, 1.5, -1.0, 0.0, 1.0], np.float32)
    sampler = Sampler(SamplingParams(temperature=0.7, seed=11))
    counts = np.bincount([sampler.sample(logits, [], []) for _ in range(40000)], minlength=6)
    x = logits.astype(np.float64) / 0.7
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    np.testing.assert_allclose(counts / 40000, want, atol=0.01)


@pytest.mark.parametrize("name", sorted(PARAM_BOUNDS))
def test_sampling_params_and_the_server_share_one_set_of_bounds(name: str) -> None:
    from edgellm.server.http.errors import ApiError
    from edgellm.server.protocol import parse_completion

    lo, hi, lo_open = PARAM_BOUNDS[name]
    outside = [hi + 0.01, lo - 0.01] + ([lo] if lo_open else [])
    inside = [hi, (lo + hi) / 2] + ([] if lo_open else [lo])
    for v in outside:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: v})
        with pytest.raises(ApiError, match=name):
            parse_completion({"prompt": "x", name: v})
    for v in inside:
        assert getattr(SamplingParams(**{name: v}), name) == v
        assert getattr(parse_completion({"prompt": "x", name: v}).params, name) == v
