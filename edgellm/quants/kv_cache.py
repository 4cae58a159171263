"""KV cache element types: one table of format facts, as llama.cpp's `--cache-type-k/-v`.

Each backend keys its own allocator, writer and attention reader by the row's name (cpu/kv_cache.py,
cuda/kv_cache.py); the engine sizes the cache from `bytes_per_token` and validates head sizes here, so
adding a type means one row here and one in each backend's table.

q8_0 is ggml's block_q8_0: 32 values along the head dimension share one f16 scale d = amax / 127, and
q = round-half-even(x * (127 / amax)) — the rule of ggml's x86 `quantize_row_q8_0` (AVX `_mm256_round_ps`
with _MM_ROUND_NEAREST), which is what llama.cpp's CPU `set_rows` uses to write a q8_0 cache. 34 bytes per
32 values instead of 64: the cache holds 1.88x the tokens in the same memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def _f16_quantize_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [..., n] -> (f16 bits uint16 [..., n], no scales: float32 [..., 0])."""
    with np.errstate(over="ignore"):  # |x| >= 65520 becomes inf, as in llama.cpp's f16 cache
        bits = np.asarray(x, np.float32).astype(np.float16).view(np.uint16)
    return bits, np.zeros((*bits.shape[:-1], 0), np.float32)


def _f16_dequantize_ref(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    return q.view(np.float16).astype(np.float32)


def _q8_0_quantize_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x f32 [..., n] (n a multiple of 32) -> (q int8 [..., n], d float32 [..., n // 32] holding f16
    values), ggml's x86 quantize_row_q8_0."""
    x = np.asarray(x, np.float32)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[..., None]), 127).astype(np.int8)
    return q.reshape(x.shape), d


def _q8_0_dequantize_ref(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    qb = q.astype(np.float32).reshape(*q.shape[:-1], q.shape[-1] // 32, 32)
    return (qb * d[..., None]).reshape(q.shape)


@dataclass(frozen=True)
class KvCacheType:
    name: str
    block: int  # values along the head dimension per block (one scale per block for quantized types)
    block_bytes: int  # bytes per block: values and scale
    # numpy references (tests, scripts): x f32 [..., n] -> (values, scales) and back
    quantize_ref: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    dequantize_ref: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def row_bytes(self, n: int) -> int:
        """Bytes of one head's n values (n a multiple of `block`: see check_head_dims)."""
        return n // self.block * self.block_bytes

    def check_head_dims(self, head_dim: int, head_dim_v: int) -> None:
        for what, n in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
            if n % self.block:
                raise ValueError(
                    f"KV cache dtype {self.name} stores blocks of {self.block} values along the head, but "
                    f"this model's {what} is {n} (not a multiple of {self.block}); use kv_cache_dtype='f16'"
                )

    def bytes_per_token(self, n_layers: int, n_kv_heads: int, head_dim: int, head_dim_v: int) -> int:
        """KV bytes one token takes in every layer (K and V)."""
        return n_layers * n_kv_heads * (self.row_bytes(head_dim) + self.row_bytes(head_dim_v))


KV_CACHE_TYPES: dict[str, KvCacheType] = {
    t.name: t
    for t in (
        KvCacheType("f16", 1, 2, _f16_quantize_ref, _f16_dequantize_ref),
        KvCacheType("q8_0", 32, 34, _q8_0_quantize_ref, _q8_0_dequantize_ref),
    )
}
DEFAULT_KV_CACHE_DTYPE = "f16"


def get_kv_cache_type(name: str) -> KvCacheType:
    kv = KV_CACHE_TYPES.get(name) if isinstance(name, str) else None
    if kv is None:
        raise ValueError(f"unknown KV cache dtype {name!r} (supported: {', '.join(KV_CACHE_TYPES)})")
    return kv
