"""The AVX-512 VNNI matmul path (vnni's tile16 layout) against the portable kernels over int8 rows:
bit-identical outputs for every quantized type and batch size, exact extreme values, the layout round trip,
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
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.packed import dequantize_rows_cpu, pack_weight, tile_packed
from edgellm.gguf.reader import TensorInfo
from edgellm.quants import QUANT_TRAITS, get_traits
from tests.test_backend_ops import FLOAT_TYPES, random_raw

QUANT_TYPES = [t for t in QUANT_TRAITS if t not in FLOAT_TYPES]
needs_vnni = pytest.mark.skipif(not vnni._host_has_vnni(), reason="host CPU has no AVX-512 VNNI")


def shapes_for(qtype: T) -> list[tuple[int, int]]:
    """(N, K): N % 16 != 0 leaves a partial last tile (computed into scratch), N < 16 is a lone partial
    tile, and K=544 is an odd number of 32-byte groups."""
    if get_traits(qtype).block_size == 256:  # k-quants: K must be a multiple of 256
        return [(38, 256), (7, 768)]
    return [(38, 576), (7, 544), (64, 256), (3, 64)]


def both_layouts(x: np.ndarray, packed) -> tuple[np.ndarray, np.ndarray]:
    outs = []
    for w in (packed, tile_packed(packed)):
        out = np.full((x.shape[0], packed.rows), np.nan, np.float32)
        matmul_cpu(x, w, out)
        outs.append(out)
    return outs[0], outs[1]


@needs_vnni
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_vnni_matches_portable_bit_for_bit(qtype: T) -> None:
    rng = np.random.default_rng(zlib.crc32(qtype.name.encode()))
    for rows, cols in shapes_for(qtype):
        packed = pack_weight(qtype, random_raw(qtype, rows, cols, rng), rows, cols)
        for m_rows in (1, 2, 5, 9):  # 5 and 9: register blocks of 4 plus single leftover rows
            x = rng.standard_normal((m_rows, cols)).astype(np.float32)
            portable, fast = both_layouts(x, packed)
            assert np.isfinite(portable).all()
            np.testing.assert_array_equal(fast, portable, err_msg=f"{qtype.name} {rows}x{cols} M={m_rows}")


@needs_vnni
def test_vnni_extreme_int8_values_are_exact() -> None:
    """Weights of -128 (no positive counterpart) against activations of +-127: the largest group sums, where
    a wrong unsigned/signed split, offset correction or a saturating instruction would show."""
    rows, cols = 8, 128
    raw = random_raw(T.Q8_0, rows, cols, np.random.default_rng(1))
    blocks = raw.view([("d", "<f2"), ("qs", "i1", 32)])
    blocks["qs"] = -128
    blocks["qs"][::2, :, ::3] = 127
    packed = pack_weight(T.Q8_0, raw, rows, cols)
    x = np.full((3, cols), -1.0, np.float32)
    x[1] = 1.0
    x[2, ::2] = 1.0
    portable, fast = both_layouts(x, packed)
    np.testing.assert_array_equal(fast, portable)
    ref = x.astype(np.float64) @ (packed.scale.repeat(32, axis=1) * packed.q).T.astype(np.float64)
    np.testing.assert_allclose(fast, ref, rtol=1e-3)  # f16 activation scale: ~1e-4 relative


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_tile_layout_round_trip(qtype: T) -> None:
    """to_tiles/from_tiles invert each other (padding rows dropped), and rows gathered from the tiles are
    the row layout's rows bit for bit (the tied embedding is read from the tiles)."""
    rows, cols = 37, 256
    rng = np.random.default_rng(5)
    packed = pack_weight(qtype, random_raw(qtype, rows, cols, rng), rows, cols)
    tiled = tile_packed(packed)
    assert tiled.tiles.qt.shape == (3, cols // 4, 16, 4) and tiled.q is None
    np.testing.assert_array_equal(vnni.from_tiles(tiled.tiles.qt, rows), packed.q)
    ids = np.array([0, 36, 15, 16, 5, 36])
    np.testing.assert_array_equal(dequantize_rows_cpu(tiled, ids), dequantize_rows_cpu(packed, ids))


def test_backend_layout_follows_vnni_active(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU backend tiles quantized weights exactly when the VNNI path is active, and the results agree."""
    rng = np.random.default_rng(3)
    raw = random_raw(T.Q4_0, 16, 256, rng)
    tensors = [TensorInfo(name="w", qtype=T.Q4_0, shape=(16, 256), offset=0, n_bytes=raw.nbytes, data=raw)]
    x = rng.standard_normal((2, 256)).astype(np.float32)
    outs = []
    for active in (False, True) if vnni._host_has_vnni() else (False,):
        monkeypatch.setattr(vnni, "VNNI_ACTIVE", active)
        w = CpuBackend().load_matrix(tensors)
        assert (w.tiles is not None) == active and (w.q is None) == active
        out = np.empty((2, 16), np.float32)
        CpuBackend().matmul(x, w, out)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize("env_value,expect_active", [("1", False), ("0", None)])
def test_env_forces_portable_path(env_value: str, expect_active: bool | None) -> None:
    env = dict(os.environ, EDGELLM_NO_VNNI=env_value)
    code = "from edgellm.backends.cpu import vnni; print(vnni.VNNI_ACTIVE, vnni._host_has_vnni())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    active, host = result.stdout.split()
    assert active == str(expect_active if expect_active is not None else host == "True")


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0, T.Q4_1, T.F16], ids=lambda t: t.name)
def test_chunked_tiling_equals_whole_matrix_tiling(monkeypatch: pytest.MonkeyPatch, qtype: T) -> None:
    """pack_weight_tiled (big matrices, a chunk of rows at a time) builds exactly the tiles of packing the
    whole matrix and tiling it, including a partial last chunk and tile."""
    from edgellm.backends.cpu import packed

    monkeypatch.setattr(packed, "TILED_CHUNK_ROWS", 32)
    raw = random_raw(qtype, 77, 256, np.random.default_rng(9))
    chunked = packed.pack_weight_tiled(qtype, raw, 77, 256)
    whole = tile_packed(pack_weight(qtype, raw, 77, 256))
    assert chunked.rows == whole.rows == 77
    if whole.tiles is None:  # float types keep their dense form
        np.testing.assert_array_equal(chunked.dense, whole.dense)
        return
    np.testing.assert_array_equal(chunked.tiles.qt, whole.tiles.qt)
    np.testing.assert_array_equal(chunked.tiles.sct, whole.tiles.sct)
    if whole.tiles.mnt is None:
        assert chunked.tiles.mnt is None
    else:
        np.testing.assert_array_equal(chunked.tiles.mnt, whole.tiles.mnt)
