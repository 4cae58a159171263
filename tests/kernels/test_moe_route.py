"""The CPU backend's compiled MoE routing (backends/cpu/moe/route.py) against arch/moe.py's numpy routing:
the same experts and pair order, weights to float32 rounding; ties, NaN and infinite logits as numpy's
stable sort orders them; a row's routing independent of the rows beside it."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.arch.moe import ROUTERS, group_by_expert
from edgellm.backends.base import ExpertRoute
from edgellm.backends.cpu.moe.route import route_cpu

EXACT = ("experts", "tokens", "ids", "bounds", "where")


def _reference(logits: np.ndarray, k: int, gating: str, renormalise: bool) -> ExpertRoute:
    return group_by_expert(*ROUTERS[gating](logits, k, renormalise))


def _assert_same(got: ExpertRoute, ref: ExpertRoute) -> None:
    for field in EXACT:
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
        assert getattr(got, field).dtype == np.int64
    assert got.weights.dtype == np.float32
    np.testing.assert_allclose(got.weights, ref.weights, rtol=3e-7, atol=0)


@pytest.mark.parametrize("gating", ["softmax", "softmax_weight"])
@pytest.mark.parametrize("renormalise", [False, True])
@pytest.mark.parametrize(
    ("n_tokens", "n_expert", "k"), [(1, 64, 8), (7, 8, 2), (33, 128, 8), (5, 4, 4), (3, 6, 1)]
)
def test_routes_as_numpy_does(gating: str, renormalise: bool, n_tokens: int, n_expert: int, k: int) -> None:
    rng = np.random.default_rng(n_tokens * 1000 + n_expert + k)
    logits = (rng.standard_normal((n_tokens, n_expert)) * 3).astype(np.float32)
    got = route_cpu(logits, k, gating, renormalise)
    _assert_same(got, _reference(logits, k, gating, renormalise))
    assert got.runs == [
        (int(e), int(a), int(b)) for e, a, b in zip(got.ids, got.bounds[:-1], got.bounds[1:], strict=True)
    ]
    for t in range(n_tokens):  # each row alone routes as it does among the others
        alone = route_cpu(np.ascontiguousarray(logits[t : t + 1]), k, gating, renormalise)
        np.testing.assert_array_equal(alone.experts[0], got.experts[t])
        np.testing.assert_array_equal(alone.weights[0], got.weights[t])


@pytest.mark.parametrize("gating", ["softmax", "softmax_weight"])
def test_ties_nan_and_infinities_order_as_the_stable_sort(gating: str) -> None:
    logits = np.array(
        [
            [0.0, 2.0, 1.0, 2.0, 2.0, -1.0],  # three equal: the lower ids first
            [np.nan, 1.0, 0.0, 3.0, 3.0, 2.0],  # NaN last (softmax: every probability NaN)
            [-np.inf, 1.0, np.inf, 0.0, np.inf, 1.0],
            [-np.inf] * 6,
            [5.0] * 6,
        ],
        np.float32,
    )
    for k in (1, 3, 6):
        with np.errstate(invalid="ignore"):
            ref = _reference(logits, k, gating, True)
        got = route_cpu(logits, k, gating, True)
        for field in EXACT:
            np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=f"{field} k={k}")
        np.testing.assert_array_equal(np.isnan(got.weights), np.isnan(ref.weights))
        np.testing.assert_allclose(got.weights, ref.weights, rtol=3e-7, atol=0)
    assert route_cpu(logits, 3, gating, False).experts[0].tolist() == [1, 3, 4]


def test_bad_arguments_are_refused_and_unknown_gatings_left_to_numpy() -> None:
    logits = np.zeros((2, 4), np.float32)
    assert route_cpu(logits, 2, "sigmoid", False) is None
    for k in (0, 5):
        with pytest.raises(ValueError, match="experts per token"):
            route_cpu(logits, k, "softmax", False)
    with pytest.raises(ValueError, match="router logits"):
        route_cpu(logits.astype(np.float64), 2, "softmax", False)
    with pytest.raises(ValueError, match="router logits"):
        route_cpu(np.zeros((4, 4), np.float32)[:, ::2], 1, "softmax", False)
