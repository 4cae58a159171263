"""The vectorised expf of the attention softmax against the C library's (edgellm/backends/cpu/expf.py)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from edgellm.backends.cpu.expf import (
    DISCRIMINATING,
    EXP2_TABLE,
    FMA,
    LIBM,
    PLAIN,
    UNDERFLOW,
    exp_nonpositive_inplace,
    sample_inputs,
    vector_expf_variant,
)


def _exp(x: np.ndarray, variant: int) -> np.ndarray:
    out = np.ascontiguousarray(x, np.float32).copy()
    exp_nonpositive_inplace(out, variant, EXP2_TABLE)
    return out


def test_the_picked_variant_gives_libms_bits_on_inputs_it_was_not_picked_on() -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0x80000000, 0xC2D00001, 2_000_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), -rng.exponential(5.0, 500_000).astype(np.float32)])
    variant = vector_expf_variant()
    assert np.array_equal(_exp(x, variant).view(np.uint32), _exp(x, LIBM).view(np.uint32))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's expf is the one this follows")
def test_glibc_gets_the_vectorised_form() -> None:
    assert vector_expf_variant() in (FMA, PLAIN)


def test_the_two_builds_differ_on_the_sample_so_the_check_can_tell_them_apart() -> None:
    x = sample_inputs()
    fma, plain = _exp(x, FMA), _exp(x, PLAIN)
    differ = np.flatnonzero(fma.view(np.uint32) != plain.view(np.uint32))
    assert x[differ].view(np.uint32).tolist() == [int(DISCRIMINATING)]


def test_edges_zero_underflow_infinity_and_nan() -> None:
    x = np.array(
        [0.0, -0.0, -np.inf, UNDERFLOW, np.nextafter(UNDERFLOW, np.float32(-np.inf)), np.nan], np.float32
    )
    for variant in (FMA, PLAIN):
        y = _exp(x, variant)
        assert y[0] == 1.0 and y[1] == 1.0 and y[2] == 0.0 and y[4] == 0.0
        assert 0.0 < y[3] < 1e-44  # the last subnormal above zero's rounding edge
        assert np.isnan(y[5])
