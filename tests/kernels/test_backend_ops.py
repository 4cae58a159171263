"""Backend ops vs the gguf reference, for every supported tensor type.

The reference is gguf.quants.dequantize on random-but-valid raw blocks, with the product taken in float64.
Error is NMSE = sum((y - ref)^2) / sum(ref^2). Thresholds:
- float weights (F32/F16/BF16): only f32 accumulation error, < 1e-10.
- quantized weights: activations are quantized to int8 as llama.cpp does for the type (q8_0/q8_1 per 32,
  q8_K per 256), which for Gaussian inputs gives NMSE ~2e-5 (measured 1e-5..6e-5); < 2e-4 leaves margin.
Outputs are written into a slice of a larger buffer whose guard regions must stay untouched.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from edgellm.backends.cpu import tiers
from edgellm.backends.cpu.matmul import ACT_MODES, matmul_cpu, quantize_act_cpu
from edgellm.backends.cpu.packed import dequantize_rows_cpu, pack_weight, pack_weight_tiled
from edgellm.quants import QUANT_TRAITS, UnsupportedQuantError, get_traits
from edgellm.quants.activations import quantize_act_ref
from edgellm.testing.kernel_refs import (
    FLOAT_TYPES,
    GELU_SPECIAL,
    NMSE_LIMIT,
    gelu_ref,
    layernorm_ref,
    nmse,
    random_raw,
    reference_weight,
)

SHAPES = [(64, 256), (96, 512), (33, 768)]  # (N, K); K is a multiple of 256 for the k-quants
GUARD = 3  # guard rows/cols around the written slice


def guarded_buffer(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A NaN-filled buffer and the interior (strided) view an op must write; the rest is guard."""
    buf = np.full((rows + 2 * GUARD, cols + 2 * GUARD), np.nan, np.float32)
    return buf, buf[GUARD : GUARD + rows, GUARD : GUARD + cols]


def assert_guards_untouched(buf: np.ndarray, rows: int, cols: int) -> None:
    mask = np.ones(buf.shape, bool)
    mask[GUARD : GUARD + rows, GUARD : GUARD + cols] = False
    assert np.isnan(buf[mask]).all(), "op wrote outside its output slice"


# Weight layouts of the CPU backend: int8 rows (portable kernels, every host) and vnni's tile16 (the tile
# tiers, run here with the active one; tests/kernels/test_vnni_kernels.py runs every tier). Float
# types: one layout.
CASES = [
    pytest.param(op, qtype, shape, layout, id=f"{op}-{qtype.name}-{shape[0]}x{shape[1]}-{layout}")
    for op in ("matmul_m1", "matmul_m2", "matmul_m7", "matmul_m33", "get_rows")
    for qtype in QUANT_TRAITS
    for shape in SHAPES
    for layout in (["rows"] if qtype in FLOAT_TYPES else ["rows", "tile16"])
]


@pytest.mark.parametrize("op,qtype,shape,layout", CASES)
def test_backend_op_matches_reference(op: str, qtype: T, shape: tuple[int, int], layout: str) -> None:
    if layout == "tile16" and not tiers.compiled_tiers():
        pytest.skip("host CPU has no tile tier")
    rows, cols = shape
    rng = np.random.default_rng(zlib.crc32(f"{op}-{qtype.name}-{shape}".encode()))
    raw = random_raw(qtype, rows, cols, rng)
    ref_w = reference_weight(qtype, raw, rows, cols)
    if layout == "tile16":
        packed = pack_weight_tiled(qtype, raw, rows, cols)
        assert packed.tiles is not None and packed.q is None
    else:
        packed = pack_weight(qtype, raw, rows, cols)
    if op == "get_rows":
        ids = rng.integers(0, rows, 9)
        got = dequantize_rows_cpu(packed, ids)
        # Same float ops as gguf's dequantize: exact, not just close.
        np.testing.assert_array_equal(got, ref_w[ids].astype(np.float32))
        return
    m_rows = int(op.removeprefix("matmul_m"))
    x = rng.standard_normal((m_rows, cols)).astype(np.float32)
    buf, out = guarded_buffer(m_rows, rows)
    matmul_cpu(x, packed, out)
    assert_guards_untouched(buf, m_rows, rows)
    # llama.cpp converts activations to an F16/BF16 weight's type before the dot product; we do too.
    x_ref = x
    if qtype in (T.F16, T.BF16):
        x_ref = gguf_quants.dequantize(gguf_quants.quantize(x, qtype), qtype)
    err = nmse(out, x_ref.astype(np.float64) @ ref_w.T)
    assert err < NMSE_LIMIT[qtype], f"{qtype.name} {op} {shape}: NMSE {err:.2e}"


@pytest.mark.parametrize("qtype", [t for t in QUANT_TRAITS if t not in FLOAT_TYPES], ids=lambda t: t.name)
def test_unpack_ref_reproduces_gguf_dequantize(qtype: T) -> None:
    rows, cols = 7, 512
    raw = random_raw(qtype, rows, cols, np.random.default_rng(qtype.value))
    traits = get_traits(qtype)
    q, scale, minv = traits.unpack_ref(raw)
    assert q.dtype == np.int8 and q.shape == (rows, cols)
    assert scale.shape == (rows, cols // traits.group) and (minv is not None) == traits.has_min
    rebuilt = scale[:, :, None] * q.reshape(rows, -1, traits.group).astype(np.float32)
    if minv is not None:
        rebuilt = rebuilt + minv[:, :, None]
    np.testing.assert_array_equal(rebuilt.reshape(rows, cols), reference_weight(qtype, raw, rows, cols))


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F32], ids=lambda t: t.name)
def test_matmul_is_batch_invariant(qtype: T) -> None:
    rows, cols = 40, 512
    rng = np.random.default_rng(7)
    packed = pack_weight(qtype, random_raw(qtype, rows, cols, rng), rows, cols)
    x = rng.standard_normal((13, cols)).astype(np.float32)
    batched = np.empty((13, rows), np.float32)
    matmul_cpu(x, packed, batched)
    for m_rows in (2, 5, 8):  # other batch sizes exercise the 4x2 tile and the leftover-row paths
        part = np.empty((m_rows, rows), np.float32)
        matmul_cpu(np.ascontiguousarray(x[13 - m_rows :]), packed, part)
        np.testing.assert_array_equal(part, batched[13 - m_rows :])
    for m in range(13):
        single = np.empty((1, rows), np.float32)
        matmul_cpu(np.ascontiguousarray(x[m : m + 1]), packed, single)
        np.testing.assert_array_equal(single[0], batched[m], err_msg=f"row {m} differs from the M=1 result")


def test_unsupported_type_raises_clear_error() -> None:
    with pytest.raises(UnsupportedQuantError, match=r"NVFP4 in tensor blk\.0\.attn_q\.weight"):
        pack_weight(T.NVFP4, np.zeros((4, 144), np.uint8), 4, 256, name="blk.0.attn_q.weight")
    assert issubclass(UnsupportedQuantError, ValueError)


@pytest.mark.parametrize("vec_dot,group", [("q8_0", 32), ("q8_1", 32), ("q8_K", 32), ("q8_K", 16)])
def test_activation_quantization_matches_llama_cpp_rule(vec_dot: str, group: int) -> None:
    """The kernel quantizes activations exactly as the numpy statement of llama.cpp's rule (incl. ties,
    an all-zero block and a block whose largest value is negative)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 512)) * 3).astype(np.float32)
    x[1, :256] = 0.0
    x[2, 3] = -40.0
    x[3, :32] = np.float32(127.0) / 254.0 * np.arange(32)  # exact .5 ties after scaling
    xq, xs, xsum, xisum = quantize_act_cpu(x, group, ACT_MODES[vec_dot])
    want = quantize_act_ref(x, group, vec_dot)
    for g, w in zip((xq, xs, xsum), want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(xisum, want[0].reshape(5, -1, group).astype(np.int64).sum(-1))


@pytest.mark.parametrize("shape", [(1, 64), (7, 300), (33, 768)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
def test_layernorm_cpu_matches_reference(shape: tuple[int, int], in_place: bool) -> None:
    from edgellm.backends.cpu.layernorm_gelu import layernorm_cpu

    rows, n = shape
    rng = np.random.default_rng(zlib.crc32(f"layernorm-{shape}".encode()))
    x = (rng.standard_normal((rows, n)) * 3 + rng.standard_normal((rows, 1)) * 5).astype(np.float32)
    w = (rng.standard_normal(n) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ref = layernorm_ref(x, w, b, 1e-5)
    buf, view = guarded_buffer(rows, n)
    view[:] = x
    if in_place:
        layernorm_cpu(view, w, b, 1e-5, view)
    else:
        o_buf, out = guarded_buffer(rows, n)
        layernorm_cpu(view, w, b, 1e-5, out)
        assert_guards_untouched(o_buf, rows, n)
        view = out
    assert_guards_untouched(buf, rows, n)
    assert nmse(view, ref) < 1e-12


@pytest.mark.parametrize("shape", [(1, 64), (9, 1000)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gelu_cpu_is_ggmls_f16_table(shape: tuple[int, int]) -> None:
    from edgellm.backends.cpu.layernorm_gelu import gelu_cpu

    rows, n = shape
    rng = np.random.default_rng(zlib.crc32(f"gelu-{shape}".encode()))
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    x.reshape(-1)[: len(GELU_SPECIAL)] = GELU_SPECIAL
    buf, view = guarded_buffer(rows, n)
    view[:] = x
    gelu_cpu(view)
    assert_guards_untouched(buf, rows, n)
    np.testing.assert_array_equal(view, gelu_ref(x))


@pytest.mark.parametrize("rows", [1, 9])  # the serial driver (decode) and the row-parallel one
def test_geglu_is_ggmls_f16_table_times_up(rows: int) -> None:
    """Gemma's GeGLU as ggml_vec_geglu_f32: 0 where gate <= -10 (whatever up is), gate * up where gate >=
    10, else the table entry of gate's f16 bits times up: bit for bit, at the table's edges too."""
    from edgellm.backends.cpu.backend import CpuBackend

    n = 1000
    rng = np.random.default_rng(zlib.crc32(f"geglu-{rows}".encode()))
    gate = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    gate.reshape(-1)[: len(GELU_SPECIAL)] = GELU_SPECIAL[: rows * n]
    up = rng.standard_normal((rows, n)).astype(np.float32)
    up[0, :2] = np.inf  # beside gates of -10 and 10: 0, not 0 * inf, and inf
    gate_up = np.ascontiguousarray(np.concatenate([gate, up], axis=1))
    buf, view = guarded_buffer(rows, n)
    CpuBackend().gated_act(gate_up, view, "gelu")
    assert_guards_untouched(buf, rows, n)
    with np.errstate(invalid="ignore"):  # the reference's 0 * inf, which np.where then drops
        want = np.where(gate <= -10, np.float32(0), gelu_ref(gate) * up).astype(np.float32)
    np.testing.assert_array_equal(view, want)
