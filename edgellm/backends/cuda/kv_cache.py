"""The CUDA backend's KV cache per element type (quants/kv_cache.py's table).

Layouts per layer, one row per (block, position, KV head) as the kernels index them:
- f16: K [n_blocks, block_size, Hkv, d] and V [..., dv] float16 (llama.cpp's default cache).
- q8_0: values int8 [n_blocks, block_size, Hkv, d] and scales float16 [..., d/32] (ggml's block_q8_0
  split into two arrays, 34 bytes per 32 values; the device has no cheap way to read an f16 out of a
  byte array). The writers (write_kv_cuda, heads_rope_kv_cuda) quantize with quantize_kv_block; attention
  reads the blocks directly (attention.py), a flag selecting the path: one compiled kernel serves both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import cuda

from edgellm.backends.cuda.config import mul_rn, rint_f32

KV_BLOCK = 32  # q8_0 values per scale


@cuda.jit(device=True, inline=True)
def quantize_kv_block(src, base, q, s, blk, o, h, c):  # noqa: ANN001
    """Quantize src[base : base + 32] into q[blk, o, h, 32c : 32c + 32] and its scale s[blk, o, h, c], by
    quants/kv_cache.py's rule (ggml's x86 quantize_row_q8_0): d = f16(amax / 127), q = rint(x * 127/amax)."""
    amax = np.float32(0.0)
    for i in range(KV_BLOCK):
        a = abs(src[base + i])
        if a > amax:
            amax = a
    iscale = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
    s[blk, o, h, c] = amax / np.float32(127.0)  # a float16 store: rounded to nearest even
    for i in range(KV_BLOCK):
        qv = min(rint_f32(mul_rn(src[base + i], iscale)), np.float32(127.0))
        q[blk, o, h, c * KV_BLOCK + i] = np.int32(qv)


@dataclass
class DeviceKvLayer:
    k: Any  # f16 values, or q8_0 int8 values [n_blocks, block_size, Hkv, d]
    v: Any
    k_scale: Any  # q8_0: float16 [n_blocks, block_size, Hkv, d/32]; f16: a 1-element placeholder
    v_scale: Any
    blocks: list[Any] = field(default_factory=list)  # the arrays indexed by block (copy-on-write copies)


@dataclass(frozen=True)
class CudaKvType:
    values: type  # element type of the value arrays
    q8: bool  # the kernels' flag: values are q8_0 with per-32 scales


CUDA_KV_TYPES: dict[str, CudaKvType] = {
    "f16": CudaKvType(np.float16, False),
    "q8_0": CudaKvType(np.int8, True),
}


class DeviceKvCache:
    """Every layer's cache of one element type on the device."""

    def __init__(self, dtype: str, n_layers: int, n_blocks: int, bs: int, n_kv: int, d: int, dv: int) -> None:
        self.dtype = dtype
        self.kind = kind = CUDA_KV_TYPES[dtype]
        def zeros(shape: tuple[int, ...], t: type) -> Any:
            return cuda.to_device(np.zeros(shape, t))

        placeholder = zeros((1, 1, 1, 1), np.float16)
        self.layers = []
        for _ in range(n_layers):
            k, v = zeros((n_blocks, bs, n_kv, d), kind.values), zeros((n_blocks, bs, n_kv, dv), kind.values)
            if kind.q8:
                ks = zeros((n_blocks, bs, n_kv, d // KV_BLOCK), np.float16)
                vs = zeros((n_blocks, bs, n_kv, dv // KV_BLOCK), np.float16)
                self.layers.append(DeviceKvLayer(k, v, ks, vs, [k, v, ks, vs]))
            else:
                self.layers.append(DeviceKvLayer(k, v, placeholder, placeholder, [k, v]))
