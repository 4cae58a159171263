"""The K-quants' load-time reordering (backends/cpu/k_quant_order.py) against a byte-by-byte statement of
it, on strided views as the GGUF's block fields are; the tile kernels' own tests check the result end to
end (gather against gguf's dequantize, matmul against the portable kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.cpu.k_quant_order import regroup_fields, split16


def _column_nibbles_ggml(qs: np.ndarray, run: int) -> np.ndarray:
    """Each column's 4 bits in column order, from ggml's order (byte o of a run: columns o and run + o)."""
    r = qs.reshape(*qs.shape[:-1], -1, run)
    return np.concatenate([r & 0x0F, r >> 4], axis=-1).reshape(*qs.shape[:-1], -1)


def _column_nibbles_legacy(qs: np.ndarray) -> np.ndarray:
    """The same from the legacy order (byte o of 16: columns o and 16 + o of 32)."""
    return _column_nibbles_ggml(qs, 16)


def _column_fields(qh: np.ndarray, bits: int, stride: int) -> np.ndarray:
    """Each column's high bits, from bytes whose bit-field i of byte o holds column stride * i + o of each
    8 // bits * stride columns."""
    fields = 8 // bits
    r = qh.reshape(*qh.shape[:-1], -1, stride)  # [..., spans, o]
    cols = [(r >> (bits * i)) & ((1 << bits) - 1) for i in range(fields)]  # field i: columns stride * i + o
    return np.stack(cols, axis=-2).reshape(*qh.shape[:-1], -1)


@pytest.mark.parametrize("run", [32, 64])  # Q4_K/Q5_K's qs, Q6_K's ql
def test_split16_moves_every_nibble_to_its_legacy_place(run: int) -> None:
    rng = np.random.default_rng(run)
    blocks = rng.integers(0, 256, (7, 3, 210), dtype=np.uint8)
    qs = blocks[:, :, 16:144]  # a block field: strided across blocks, 128 bytes each
    got = split16(qs, run)
    assert got.shape == qs.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(_column_nibbles_legacy(got), _column_nibbles_ggml(qs, run))


@pytest.mark.parametrize(("bits", "n"), [(1, 32), (2, 64)])  # Q5_K's qh, Q6_K's qh
def test_regroup_fields_moves_every_high_bit_field_to_its_place(bits: int, n: int) -> None:
    rng = np.random.default_rng(bits)
    qh = rng.integers(0, 256, (5, 4, 100), dtype=np.uint8)[:, :, 4 : 4 + n]
    got = regroup_fields(qh, bits)
    assert got.shape == qh.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(_column_fields(got, bits, 32 * bits // 8), _column_fields(qh, bits, 32))
