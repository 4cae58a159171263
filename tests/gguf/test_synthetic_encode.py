"""Synthetic-model encodings: the Q4_K / Q6_K reference quantizers against gguf's own dequantizer, the
random blocks of the types gguf cannot quantize (valid, at the intended spread), and the vocabulary padding
that gives synthetic models a real model's vocabulary size."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.quants import BLOCK_DTYPES
from edgellm.testing.encode import KQUANT_REF, random_raw_blocks, scale_fields
from edgellm.testing.synthetic.models import write_tiny_model

# NMSE of a plain min/max quantizer on normal weights: ~6e-3 for 4 bits, ~4e-4 for 6 bits.
KQUANT_NMSE = {T.Q4_K: 1e-2, T.Q6_K: 1e-3}


@pytest.mark.parametrize("qtype", list(KQUANT_REF), ids=lambda q: q.name)
def test_kquant_reference_round_trips_through_gguf_dequantize(qtype: T) -> None:
    rng = np.random.default_rng(7)
    w = (0.02 + 0.05 * rng.standard_normal((6, 768))).astype(np.float32)
    w[1] = 0.0  # an all-zero row: zero scales, zeros back
    w[2, :256] = np.linspace(-1, 3, 256)  # a block with an outlier range
    raw = KQUANT_REF[qtype](w)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert raw.dtype == np.uint8 and raw.shape == (6, 768 // block * type_size)
    back = gguf.quants.dequantize(raw, qtype)
    assert back.shape == w.shape
    assert np.all(back[1] == 0)
    err = float(np.mean((back - w) ** 2) / np.mean(w**2))
    assert err < KQUANT_NMSE[qtype], err
    # every sub-block is quantized on its own grid: the worst error is about half a step
    step = (w.max() - w.min()) / (15 if qtype == T.Q4_K else 62)
    assert np.abs(back - w).max() < step


@pytest.mark.parametrize("qtype", list(KQUANT_REF), ids=lambda q: q.name)
def test_kquant_reference_rejects_partial_blocks(qtype: T) -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        KQUANT_REF[qtype](np.zeros((2, 200), np.float32))


NEW_TYPES = [T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.IQ3_S, T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M,
             T.TQ1_0, T.TQ2_0]  # fmt: skip


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda q: q.name)
def test_random_blocks_decode_to_the_intended_spread(qtype: T) -> None:
    """Finite weights of about the asked-for standard deviation (MXFP4's power-of-two scale within a
    factor sqrt(2)); the ternary types hold only the bytes gguf's quantizer writes."""
    raw = random_raw_blocks(qtype, 8, 512, 0.05, np.random.default_rng(3))
    w = gguf.quants.dequantize(raw, qtype)
    assert np.isfinite(w).all() and 0.05 / 1.5 < w.std() < 0.05 * 1.5, w.std()
    if qtype == T.TQ1_0:  # 5 trits a byte: 3^5 = 243 patterns, stored as ceil(v * 256 / 243)
        blocks = raw.view(np.uint8).reshape(-1, 54)
        np.testing.assert_array_equal(gguf.quants.quantize(w, qtype).reshape(-1, 54), blocks)
    if qtype == T.TQ2_0:  # 2-bit codes 0..2 (3, "+2", is never written)
        crumbs = raw.reshape(-1, 66)[:, :64, None] >> np.array([0, 2, 4, 6], np.uint8)
        assert ((crumbs & 3) < 3).all()


@pytest.mark.parametrize("qtype", [T.MXFP4, T.IQ1_M, T.IQ2_XS], ids=lambda q: q.name)
def test_scale_fields_set_what_they_get(qtype: T) -> None:
    """Each scale field reads back what was set (MXFP4: powers of two; IQ1_M: f16 values split over four
    nibbles, leaving the 3-bit sub-scales beside them untouched)."""
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (4, 256 // gguf.GGML_QUANT_SIZES[qtype][0] * gguf.GGML_QUANT_SIZES[qtype][1]))
    blocks = raw.astype(np.uint8).view(BLOCK_DTYPES[qtype])
    other = blocks.copy()
    for field in scale_fields(qtype):
        want = (
            2.0 ** rng.integers(-20, 5, blocks.shape)
            if qtype == T.MXFP4
            else rng.uniform(-2, 2, blocks.shape)
        )
        want = want.astype(np.float16).astype(np.float32)
        field.set(blocks, want)
        np.testing.assert_array_equal(field.get(blocks), want)
    if qtype == T.IQ1_M:
        np.testing.assert_array_equal(blocks["scales"] & 0x0FFF, other["scales"] & 0x0FFF)
        np.testing.assert_array_equal(blocks["qs"], other["qs"])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_vocabulary_padded_to_a_real_size(arch: str, tmp_path: Path) -> None:
    qtypes = {"*": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K"}
    path = write_tiny_model(
        tmp_path / "m.gguf", arch, qtypes, n_heads=2, n_kv_heads=1, head_dim=128, n_ff=256, n_vocab=1000,
        tied=True, quantize_kquants=True,
    )  # fmt: skip
    g = load_gguf(path)
    cfg = config_from_gguf(g)
    assert cfg.n_vocab == 1000
    assert tuple(g.tensors["token_embd.weight"].shape) == (1000, 64)
    down = g.tensors["blk.0.ffn_down.weight"]
    w = gguf.quants.dequantize(np.asarray(down.data), T.Q6_K)
    assert 0.5 < float(w.std()) * 16 < 2  # quantized from N(0, 1/n_ff): the intended spread
    with pytest.raises(ValueError, match="at least"):
        write_tiny_model(tmp_path / "small.gguf", arch, n_vocab=10)
