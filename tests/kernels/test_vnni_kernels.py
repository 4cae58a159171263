"""The tile matmul path (vnni's tile16 layouts, at the GGUF's bit width) on every CPU tier the host can run
(tests/conftest.py compiles them all) against the portable kernels over int8 rows: bit-identical outputs
for every quantized type and batch size, exact extreme values, the bytes each layout streams, stacking,
chunked repacking, and the backend's layout following its tier."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm.backends.cpu import tiers
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.packed import dequantize_rows_cpu, pack_tiles, pack_weight, pack_weight_tiled
from edgellm.backends.cpu.tile_layouts import TILE_LAYOUTS
from edgellm.gguf.reader import TensorInfo
from edgellm.quants import BLOCK_DTYPES, QUANT_TRAITS, get_traits
from edgellm.testing.kernel_refs import FLOAT_TYPES, random_raw

QUANT_TYPES = [t for t in QUANT_TRAITS if t not in FLOAT_TYPES]
TILE_TIERS = [t.name for t in tiers.compiled_tiers()]  # every tier with tile kernels the host runs
needs_tiles = pytest.mark.skipif(not TILE_TIERS, reason="host CPU has no tile tier (tiers.py)")
each_tier = pytest.mark.parametrize("tier", TILE_TIERS)


def shapes_for(qtype: T) -> list[tuple[int, int]]:
    """(N, K): N % 16 != 0 leaves a partial last tile (computed into scratch), N < 16 is a lone partial
    tile, and K=544 is an odd number of 32-byte groups."""
    if get_traits(qtype).block_size == 256:  # k-quants: K must be a multiple of 256
        return [(38, 256), (7, 768)]
    return [(38, 576), (7, 544), (64, 256), (3, 64)]


def both_layouts(x: np.ndarray, qtype: T, raw: np.ndarray, tier: str) -> tuple[np.ndarray, np.ndarray]:
    """(portable kernels over int8 rows, tier's tile kernels) outputs."""
    rows, cols = raw.shape[0], x.shape[1]
    packed = pack_weight(qtype, raw, rows, cols)
    outs = []
    for w in (packed, pack_weight_tiled(qtype, raw, rows, cols)):
        out = np.full((x.shape[0], packed.rows), np.nan, np.float32)
        matmul_cpu(x, w, out, None, tiers.by_name(tier).index)
        outs.append(out)
    return outs[0], outs[1]


@each_tier
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_vnni_matches_portable_bit_for_bit(qtype: T, tier: str) -> None:
    rng = np.random.default_rng(zlib.crc32(qtype.name.encode()))
    for rows, cols in shapes_for(qtype):
        raw = random_raw(qtype, rows, cols, rng)
        # 2: a block of 2; 3: one row, then a block of 2 (fewer than 4 rows to cover them); 5 and 9: blocks
        # of 4 rows plus one alone; 6: a block of 4 and one of 2; 7: the last 3 rows in a block of 4 that
        # starts before them (its first row computed twice, the second result dropped)
        for m_rows in (1, 2, 3, 5, 6, 7, 9):
            x = rng.standard_normal((m_rows, cols)).astype(np.float32)
            portable, fast = both_layouts(x, qtype, raw, tier)
            assert np.isfinite(portable).all()
            np.testing.assert_array_equal(fast, portable, err_msg=f"{qtype.name} {rows}x{cols} M={m_rows}")


@each_tier
def test_vnni_extreme_int8_values_are_exact(tier: str) -> None:
    """Weights of -128 (no positive counterpart) and rows of 127 against activations of +-127: the largest
    group sums, where a wrong unsigned/signed split, offset correction or a saturating instruction (AVX2's
    pmaddubsw on the stored unsigned bytes) would show."""
    rows, cols = 8, 128
    raw = random_raw(T.Q8_0, rows, cols, np.random.default_rng(1))
    blocks = raw.view([("d", "<f2"), ("qs", "i1", 32)])
    blocks["qs"] = -128
    blocks["qs"][::2, :, ::3] = 127
    blocks["qs"][1::4] = 127  # whole rows of 127: pairs of 127 * 127 products (past int16 if unsigned)
    packed = pack_weight(T.Q8_0, raw, rows, cols)
    x = np.full((3, cols), -1.0, np.float32)
    x[1] = 1.0
    x[2, ::2] = 1.0
    portable, fast = both_layouts(x, T.Q8_0, raw, tier)
    np.testing.assert_array_equal(fast, portable)
    ref = x.astype(np.float64) @ (packed.scale.repeat(32, axis=1) * packed.q).T.astype(np.float64)
    np.testing.assert_allclose(fast, ref, rtol=1e-3)  # f16 activation scale: ~1e-4 relative


@each_tier
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_vnni_extreme_quants_are_exact(qtype: T, tier: str) -> None:
    """Every quant bit set or clear (largest and smallest values of each type, high bits included) against
    activations of +-127: where a wrong nibble/bit-plane split, shift or offset would show, or an int16
    sum overflow (AVX2 adds the pair sums of several words before it widens them). Five activation rows:
    a block of four and one alone, both kernel variants."""
    rows, cols = 32, 256
    raw = random_raw(qtype, rows, cols, np.random.default_rng(2))
    blocks = raw.view(BLOCK_DTYPES[qtype])
    for field in ("qs", "qh", "ql", "hmask"):
        if field in blocks.dtype.names:
            blocks[field][::2] = np.array(-1).astype(blocks.dtype[field].base)  # all ones
            blocks[field][1::2] = 0
    x = np.full((5, cols), -1.0, np.float32)
    x[1] = x[3] = 1.0
    x[2, ::2] = 1.0
    portable, fast = both_layouts(x, qtype, raw, tier)
    np.testing.assert_array_equal(fast, portable)


@each_tier
def test_mxfp4_exponents_widen_exactly(tier: str) -> None:
    """MXFP4's E8M0 scale byte, widened in the kernel and the row gather: every exponent from the two
    subnormal ones (e < 2) up, the same bits as gguf's e8m0_to_fp32_half."""
    rows, cols = 32, 1024  # 1,024 blocks of 32: exponents 0..199 (past that the products overflow)
    raw = random_raw(T.MXFP4, rows, cols, np.random.default_rng(5))
    blocks = raw.view(BLOCK_DTYPES[T.MXFP4])
    blocks["e"] = (np.arange(blocks.size) % 200).reshape(blocks.shape)
    tiled = pack_weight_tiled(T.MXFP4, raw, rows, cols)
    ids = np.arange(rows)
    want = get_traits(T.MXFP4).dequantize_ref(raw).reshape(rows, cols)
    np.testing.assert_array_equal(dequantize_rows_cpu(tiled, ids), want)
    x = np.random.default_rng(6).standard_normal((2, cols)).astype(np.float32)
    portable, fast = both_layouts(x, T.MXFP4, raw, tier)
    np.testing.assert_array_equal(fast, portable)


@pytest.mark.parametrize("qtype", list(TILE_LAYOUTS), ids=lambda t: t.name)
def test_tiles_keep_the_gguf_bit_width(qtype: T) -> None:
    """The tiles stream at most 5% more bytes than the GGUF's blocks (the K-quants' 6-bit scales as
    bytes); the types repacked through int8 rows (a byte plane, 0x80-offset) stream a byte a weight and
    4-byte f32 scales (and mins) per group. The group and activation quantization agree with the traits."""
    rows, cols = 48, 512
    raw = random_raw(qtype, rows, cols, np.random.default_rng(4))
    w = pack_weight_tiled(qtype, raw, rows, cols)
    traits = get_traits(qtype)
    assert w.tiles is not None and w.q is None and w.group == traits.group
    lay = TILE_LAYOUTS[qtype]
    if lay.lo_split or qtype == T.Q8_0:
        assert w.nbytes <= 1.05 * raw.nbytes, (w.nbytes, raw.nbytes)
    else:
        per_group = 4 * (1 + traits.has_min)
        assert w.nbytes == rows * cols + rows * cols // traits.group * per_group


@needs_tiles
def test_stacked_tiles_equal_separate_matrices() -> None:
    """Q|K|V stacked into one tile16 weight give the separate matrices' outputs side by side; a part
    that would leave a tile half filled (not last) is refused."""
    rng = np.random.default_rng(8)
    shapes = [(64, 256), (32, 256), (21, 256)]
    raws = [random_raw(T.Q4_K, r, c, rng) for r, c in shapes]
    stacked = pack_tiles(T.Q4_K, raws, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    out = np.empty((3, stacked.rows), np.float32)
    matmul_cpu(x, stacked, out)
    c = 0
    for raw, (r, cols) in zip(raws, shapes, strict=True):
        part = np.empty((3, r), np.float32)
        matmul_cpu(x, pack_weight(T.Q4_K, raw, r, cols), part)
        np.testing.assert_array_equal(out[:, c : c + r], part)
        c += r
    with pytest.raises(ValueError, match="not a multiple of 16"):
        pack_tiles(T.Q4_K, [raws[2], raws[0]], 256)


def test_backend_layout_follows_its_tier() -> None:
    """The CPU backend tiles quantized weights exactly on a tier with tile kernels, and every tier's
    results agree with the portable tier's."""
    rng = np.random.default_rng(3)
    raw = random_raw(T.Q4_0, 16, 256, rng)
    tensors = [TensorInfo(name="w", qtype=T.Q4_0, shape=(16, 256), offset=0, n_bytes=raw.nbytes, data=raw)]
    x = rng.standard_normal((2, 256)).astype(np.float32)
    outs = []
    for tier in ("portable", *TILE_TIERS):
        be = CpuBackend(tier)
        w = be.load_matrix(tensors)
        active = tier != "portable"
        assert (w.tiles is not None) == active and (w.q is None) == active
        out = np.empty((2, 16), np.float32)
        be.matmul(x, w, out)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_backend_stacks_runs_of_one_type() -> None:
    """Q, K (Q4_K) and V (Q6_K), as in a Q4_K_M file: on a tile tier Q|K share one tiled weight and V is
    its own; every tier writes the same outputs into the right columns."""
    rng = np.random.default_rng(6)
    specs = [("q", T.Q4_K, 32), ("k", T.Q4_K, 16), ("v", T.Q6_K, 16)]
    tensors = []
    for name, qtype, rows in specs:
        raw = random_raw(qtype, rows, 256, rng)
        tensors.append(TensorInfo(name, qtype, (rows, 256), 0, raw.nbytes, raw))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    outs = []
    for tier in ("portable", *TILE_TIERS):
        be = CpuBackend(tier)
        w = be.load_matrix(tensors)
        if tier != "portable":
            assert [(p.qtype, p.rows) for p in w.parts] == [(T.Q4_K, 48), (T.Q6_K, 16)]
        out = np.full((3, 64), np.nan, np.float32)
        be.matmul(x, w, out)
        outs.append(out)
    assert np.isfinite(outs[0]).all()
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0, T.Q5_0, T.Q6_K, T.Q2_K], ids=lambda t: t.name)
def test_chunked_tiling_equals_whole_matrix_tiling(monkeypatch: pytest.MonkeyPatch, qtype: T) -> None:
    """pack_tiles (big matrices, a chunk of rows at a time) builds exactly the tiles of repacking the whole
    matrix at once, including a partial last chunk and tile."""
    from edgellm.backends.cpu import packed

    raw = random_raw(qtype, 77, 256, np.random.default_rng(9))
    whole = packed.pack_weight_tiled(qtype, raw, 77, 256)
    monkeypatch.setattr(packed, "TILED_CHUNK_ROWS", 32)
    chunked = packed.pack_weight_tiled(qtype, raw, 77, 256)
    assert chunked.rows == whole.rows == 77
    for a, b in zip(chunked.tiles.planes, whole.tiles.planes, strict=True):
        np.testing.assert_array_equal(a, b)


@each_tier
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0, T.Q6_K, T.MXFP4], ids=lambda t: t.name)
def test_runs_of_experts_give_each_weights_own_bits(qtype: T, tier: str) -> None:
    """The mixture-of-experts kernel (each weight over its own run of activation rows, one parallel region)
    gives every row the bits of that weight's own matmul, for runs of 1 to 6 rows: runs of 2 as a block of
    2, runs of 3 as a block of 4 that reads the next run's rows (their results dropped), the last run's as
    a block that starts before it; 38 output rows leave a partial last tile."""
    from edgellm.backends.cpu.layer import pack_matrix
    from edgellm.backends.cpu.moe.experts import _runs_matmul

    rng = np.random.default_rng(zlib.crc32(qtype.name.encode()) + 1)
    rows, cols = 38, 256
    bounds = np.array([0, 2, 5, 6, 12, 14, 17], np.int64)  # runs of 2, 3, 1, 6, 2, 3 rows
    raws = [random_raw(qtype, rows, cols, rng) for _ in range(len(bounds) - 1)]
    weights = [pack_weight_tiled(qtype, raw, rows, cols) for raw in raws]
    packs = [pack_matrix(w, rows, cols, f"weight {i}") for i, w in enumerate(weights)]
    at = np.stack([p[0] for p in packs])  # [R, PARTS, 6, 2]
    x = rng.standard_normal((bounds[-1], cols)).astype(np.float32)
    got = np.full((bounds[-1], rows), np.nan, np.float32)
    _runs_matmul(x, at, packs[0][1], bounds, got, 2, tiers.by_name(tier).index)
    for r, w in enumerate(weights):
        a, b = bounds[r], bounds[r + 1]
        want = np.full((b - a, rows), np.nan, np.float32)
        matmul_cpu(x[a:b], w, want, None, tiers.by_name(tier).index)
        np.testing.assert_array_equal(got[a:b], want, err_msg=f"run {r} (rows {a}..{b - 1})")
