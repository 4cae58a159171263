"""The K-quants' quant bytes moved into the legacy types' order at load (tile_layouts.py says why), in
compiled passes over 8-byte words: numpy's dozen passes over temporaries doubled an 8B file's load time."""

from __future__ import annotations

import numpy as np
from numba import njit

_LOW = np.uint64(0x0F0F0F0F0F0F0F0F)  # every byte's low nibble


@njit(cache=True, nogil=True)
def _split16_words(w: np.ndarray, run_words: int, out: np.ndarray) -> None:
    """split16's bytes as uint64 words: per run, 4-word parts (a: words 0-1, b: words 2-3)."""
    half = run_words // 2
    four = np.uint64(4)
    for base in range(0, w.shape[0], run_words):
        for p in range(run_words // 4):
            for h in range(2):
                a, b = w[base + 4 * p + h], w[base + 4 * p + 2 + h]
                out[base + 2 * p + h] = (a & _LOW) | ((b & _LOW) << four)  # low nibbles: columns 32p ..
                out[base + half + 2 * p + h] = ((a >> four) & _LOW) | (b & ~_LOW)  # high: run + 32p ..


def split16(qs: np.ndarray, run: int) -> np.ndarray:
    """Nibble bytes uint8 [..., n] in ggml's K-quant order (per `run` bytes, byte o holds column o in its
    low nibble and column run + o in its high one) -> a new C-contiguous array of that shape in the legacy
    order (per 16 bytes, columns o and 16 + o of each 32 columns). n is a multiple of run, run of 32."""
    src = np.ascontiguousarray(qs).reshape(-1).view(np.uint64)
    out = np.empty_like(src)
    _split16_words(src, run // 8, out)
    return out.view(np.uint8).reshape(qs.shape)


@njit(cache=True, nogil=True)
def _regroup_words(w: np.ndarray, shifts: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
    """regroup_fields over words of `stride` bytes (uint64 for 2-bit fields, uint32 for 1-bit): word i of
    a span holds bytes stride * i .. stride * i + stride - 1, so new word j gathers field j of every old
    word i into field i of each of its bytes. shifts: bits * (0, 1, ..) and mask: the field's bits in every
    byte, both of w's type (mixing it with Numba's int64 would make floats)."""
    fields = shifts.shape[0]
    for base in range(0, w.shape[0], fields):
        for j in range(fields):
            v = (w[base] >> shifts[j]) & mask[0]
            for i in range(1, fields):
                v |= ((w[base + i] >> shifts[j]) & mask[0]) << shifts[i]
            out[base + j] = v


def regroup_fields(qh: np.ndarray, bits: int) -> np.ndarray:
    """High-bit bytes uint8 [..., n] in ggml's K-quant order (bit-field j of byte l holds column 32 j + l
    of the span of 8 / bits * 32 columns that 32 bytes cover) -> a new C-contiguous array of that shape
    where, per 32 columns, bit-field i of byte o holds column stride * i + o (stride = 32 * bits / 8 bytes
    per 32 columns: the layout's hi_stride), as Q5_0's high bits."""
    word = np.uint64 if bits == 2 else np.uint32
    fields = 8 // bits
    mask = np.array([int.from_bytes(bytes([(1 << bits) - 1]) * np.dtype(word).itemsize, "little")], word)
    src = np.ascontiguousarray(qh).reshape(-1).view(word)
    out = np.empty_like(src)
    _regroup_words(src, np.arange(0, 8, bits, dtype=word)[:fields], mask, out)
    return out.view(np.uint8).reshape(qh.shape)
