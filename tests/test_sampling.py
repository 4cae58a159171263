"""The host sampler without a full sort of the vocabulary: the same tokens as the full-sort algorithm for
top-k / top-p / min-p (given the same random stream), the right distribution for plain temperature
sampling, and top_k_stable equal to argsort's prefix (ties by lower id, NaN last)."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.sampling import PARAM_BOUNDS, Sampler, SamplingParams, top_k_stable


def full_sort_sample(params: SamplingParams, rng: np.random.Generator, logits: np.ndarray) -> int:
    """The previous algorithm: stable argsort of the whole row, probabilities over the whole row."""
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
    probs = probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(keep, p=probs)])


def test_top_k_stable_is_argsort_prefix() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.integers(-5, 5, 300).astype(np.float32)  # many ties
        if rng.random() < 0.3:
            x[rng.integers(0, 300, 3)] = np.nan
        k = int(rng.integers(1, 310))
        np.testing.assert_array_equal(top_k_stable(x, k), np.argsort(-x, kind="stable")[:k])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, seed=1),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2),
        SamplingParams(temperature=0.7, top_p=0.999, seed=3),  # nucleus past the first 256 candidates
        SamplingParams(temperature=1.2, min_p=0.05, seed=4),
        SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02, top_k=100, seed=5),
    ],
    ids=["top_k", "top_p", "top_p_wide", "min_p", "all"],
)
def test_truncated_sampling_draws_what_the_full_sort_draws(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    sampler = Sampler(params)
    ref_rng = np.random.default_rng(params.seed)
    for _ in range(300):
        logits = (rng.standard_normal(5000) * 3).astype(np.float32)
        assert sampler.sample(logits, [], []) == full_sort_sample(params, ref_rng, logits)


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
    from edgellm.server.protocol import ApiError, parse_completion

    lo, hi, lo_open = PARAM_BOUNDS[name]
    outside = [hi + 0.01, lo - 0.01] + ([lo] if lo_open else [])
    inside = [hi, (lo + hi) / 2] + ([] if lo_open else [lo])
    for v in outside:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: v})
        with pytest.raises(ApiError, match=name):
            parse_completion({"prompt": "x", name: v}, 1000)
    for v in inside:
        assert getattr(SamplingParams(**{name: v}), name) == v
        assert getattr(parse_completion({"prompt": "x", name: v}, 1000).params, name) == v
