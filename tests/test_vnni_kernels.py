"""The AVX-512 VNNI matmul path against the portable kernels: bit-identical outputs for every quantized type,
and the dispatch (host feature check, EDGELLM_NO_VNNI=1 forcing the portable path)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm.backends.cpu import vnni
from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.packed import pack_weight
from edgellm.quants import QUANT_TRAITS, get_traits
from tests.test_backend_ops import FLOAT_TYPES, random_raw

QUANT_TYPES = [t for t in QUANT_TRAITS if t not in FLOAT_TYPES]
needs_vnni = pytest.mark.skipif(not vnni._host_has_vnni(), reason="host CPU has no AVX-512 VNNI")


def shapes_for(qtype: T) -> list[tuple[int, int]]:
    """(N, K): N % 4 != 0 leaves rows to the serial tail; for 32-groups K=576 is an odd number of 64-byte
    chunks (zero-padded pair) and K=544 leaves a 32-byte group to the portable tail."""
    if get_traits(qtype).block_size == 256:  # k-quants: K must be a multiple of 256
        return [(38, 256), (7, 768)]
    return [(38, 576), (7, 544), (64, 256), (3, 64)]


def both_paths(monkeypatch: pytest.MonkeyPatch, x: np.ndarray, packed) -> tuple[np.ndarray, np.ndarray]:
    outs = []
    for active in (False, True):
        monkeypatch.setattr(vnni, "VNNI_ACTIVE", active)
        out = np.full((x.shape[0], packed.rows), np.nan, np.float32)
        matmul_cpu(x, packed, out)
        outs.append(out)
    return outs[0], outs[1]


@needs_vnni
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_vnni_matches_portable_bit_for_bit(monkeypatch: pytest.MonkeyPatch, qtype: T) -> None:
    rng = np.random.default_rng(zlib.crc32(qtype.name.encode()))
    for rows, cols in shapes_for(qtype):
        packed = pack_weight(qtype, random_raw(qtype, rows, cols, rng), rows, cols)
        for m_rows in (1, 2, 5):
            x = rng.standard_normal((m_rows, cols)).astype(np.float32)
            portable, fast = both_paths(monkeypatch, x, packed)
            assert np.isfinite(portable).all()
            np.testing.assert_array_equal(fast, portable, err_msg=f"{qtype.name} {rows}x{cols} M={m_rows}")


@needs_vnni
def test_vnni_extreme_int8_values_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights of -128 (no positive counterpart) against activations of +-127: the largest group sums, where
    a wrong unsigned/signed split or a saturating instruction would show."""
    rows, cols = 8, 128
    raw = random_raw(T.Q8_0, rows, cols, np.random.default_rng(1))
    blocks = raw.view([("d", "<f2"), ("qs", "i1", 32)])
    blocks["qs"] = -128
    blocks["qs"][::2, :, ::3] = 127
    packed = pack_weight(T.Q8_0, raw, rows, cols)
    x = np.full((3, cols), -1.0, np.float32)
    x[1] = 1.0
    x[2, ::2] = 1.0
    portable, fast = both_paths(monkeypatch, x, packed)
    np.testing.assert_array_equal(fast, portable)
    ref = x.astype(np.float64) @ (packed.scale.repeat(32, axis=1) * packed.q).T.astype(np.float64)
    np.testing.assert_allclose(fast, ref, rtol=1e-3)  # f16 activation scale: ~1e-4 relative


def test_dispatch_follows_vnni_active(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_kernel(*args) -> int:
        calls.append(args)
        return 0  # "no rows done": the serial tail then computes every row

    monkeypatch.setattr(vnni, "matmul_vnni_tiles_cpu", fake_kernel)
    rng = np.random.default_rng(3)
    packed = pack_weight(T.Q4_0, random_raw(T.Q4_0, 16, 256, rng), 16, 256)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    expected = np.empty((2, 16), np.float32)
    monkeypatch.setattr(vnni, "VNNI_ACTIVE", False)
    matmul_cpu(x, packed, expected)
    assert not calls
    monkeypatch.setattr(vnni, "VNNI_ACTIVE", True)
    out = np.empty((2, 16), np.float32)
    matmul_cpu(x, packed, out)
    assert len(calls) == 1
    np.testing.assert_array_equal(out, expected)  # the serial tail path is the portable arithmetic too


@pytest.mark.parametrize("env_value,expect_active", [("1", False), ("0", None)])
def test_env_forces_portable_path(env_value: str, expect_active: bool | None) -> None:
    env = dict(os.environ, EDGELLM_NO_VNNI=env_value)
    code = "from edgellm.backends.cpu import vnni; print(vnni.VNNI_ACTIVE, vnni._host_has_vnni())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    active, host = result.stdout.split()
    assert active == str(expect_active if expect_active is not None else host == "True")
