"""The CPU backend's KV cache per element type (quants/kv_cache.py's table): allocation and the writer.
attention_paged_cpu reads every type (its per-type steps are picked by the cache's element type); the
layouts are described in attention_ir.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from edgellm.backends.cpu.attention_ir import Q8_BLOCK, Q8_BYTES
from edgellm.backends.cpu.fp16 import f16_bits
from edgellm.backends.cpu.ops import write_kv_cpu


@njit(cache=True, nogil=True, inline="always")
def _q8_0_scale(x, t, h, i0) -> tuple[np.float32, np.uint16]:  # noqa: ANN001
    """(127 / amax, f16 bits of amax / 127) of x[t, h, i0 : i0 + 32], as ggml's x86 quantize_row_q8_0."""
    amax = np.float32(0.0)
    for i in range(Q8_BLOCK):
        a = abs(x[t, h, i0 + i])
        if a > amax:
            amax = a
    iscale = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
    return iscale, f16_bits(amax / np.float32(127.0))


@njit(cache=True, nogil=True, inline="always")
def _q8_0_byte(x: np.float32, iscale: np.float32) -> np.uint8:
    """round-half-even(x * iscale) (at most 127) as the byte of an int8."""
    return np.uint8(np.int32(min(np.rint(x * iscale), np.float32(127.0))) & 0xFF)


@njit(cache=True, nogil=True)
def write_kv_q8_0_cpu(k, v, k_cache, v_cache, slots) -> None:  # noqa: ANN001
    """Quantize each token's K/V [T, Hkv, d] (f32, strided views allowed) to q8_0 blocks at its slot:
    K [n_blocks, Hkv, d/32, 34, block_size] (scales in rows 0-1, values transposed), V [n_blocks,
    block_size, Hkv, dv/32, 34] (ggml's block_q8_0 bytes). slots[t] = block * block_size + offset."""
    bs = k_cache.shape[4]
    for t in range(k.shape[0]):
        blk = slots[t] // bs
        off = slots[t] % bs
        for h in range(k.shape[1]):
            for c in range(k.shape[2] // Q8_BLOCK):
                iscale, d = _q8_0_scale(k, t, h, c * Q8_BLOCK)
                b = 2 * off  # the scale's two bytes in rows 0-1 (block_size f16 values)
                k_cache[blk, h, c, b // bs, b % bs] = np.uint8(d & np.uint16(0xFF))
                k_cache[blk, h, c, (b + 1) // bs, (b + 1) % bs] = np.uint8(d >> np.uint16(8))
                for i in range(Q8_BLOCK):
                    k_cache[blk, h, c, 2 + i, off] = _q8_0_byte(k[t, h, c * Q8_BLOCK + i], iscale)
            for c in range(v.shape[2] // Q8_BLOCK):
                iscale, d = _q8_0_scale(v, t, h, c * Q8_BLOCK)
                row = v_cache[blk, off, h, c]
                row[0] = np.uint8(d & np.uint16(0xFF))
                row[1] = np.uint8(d >> np.uint16(8))
                for i in range(Q8_BLOCK):
                    row[2 + i] = _q8_0_byte(v[t, h, c * Q8_BLOCK + i], iscale)


def _alloc_f16(n_blocks: int, bs: int, n_kv: int, d: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((n_blocks, n_kv, d, bs), np.uint16), np.zeros((n_blocks, bs, n_kv, dv), np.uint16)


def _alloc_q8_0(n_blocks: int, bs: int, n_kv: int, d: int, dv: int) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.zeros((n_blocks, n_kv, d // Q8_BLOCK, Q8_BYTES, bs), np.uint8),
        np.zeros((n_blocks, bs, n_kv, dv // Q8_BLOCK, Q8_BYTES), np.uint8),
    )


def _write_q8_0(k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slots) -> None:  # noqa: ANN001
    write_kv_q8_0_cpu(k, v, k_cache, v_cache, np.asarray(slots, dtype=np.int64))


@dataclass(frozen=True)
class CpuKvKernels:
    # (n_blocks, block_size, n_kv, d, dv) -> one layer's (K, V) cache
    alloc: Callable[[int, int, int, int, int], tuple[np.ndarray, np.ndarray]]
    # (k [T, Hkv, d] f32, v [T, Hkv, dv] f32, k_cache, v_cache, slots [T]): store at the slots
    write: Callable[..., None]


CPU_KV_KERNELS: dict[str, CpuKvKernels] = {
    "f16": CpuKvKernels(_alloc_f16, write_kv_cpu),
    "q8_0": CpuKvKernels(_alloc_q8_0, _write_q8_0),
}


class CpuKvCache:
    """Every layer's (K, V) cache of one element type, and that type's kernels."""

    def __init__(self, dtype: str, n_layers: int, n_blocks: int, bs: int, n_kv: int, d: int, dv: int) -> None:
        self.dtype = dtype
        self.kernels = CPU_KV_KERNELS[dtype]
        self.layers = [self.kernels.alloc(n_blocks, bs, n_kv, d, dv) for _ in range(n_layers)]
