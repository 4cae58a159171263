"""Float32 activations in device memory as numpy-style strided views.

The model code slices activations (`qkv[:, a:b].reshape(T, H, d)`) and expects in-place kernels to see
through those views, as numpy does. Numba's device arrays refuse to reshape a non-contiguous view, so the
backend hands out `DeviceTensor`s instead: a flat device buffer plus offset, shape and strides (in
elements). Slicing and reshaping reuse numpy's own rules on a zero-copy stand-in array, so a view is legal
exactly when it is legal in numpy, and a reshape that would need a copy raises instead of silently copying.

Buffers come from a per-size free list: the model allocates the same activation shapes every step, and a
`cuda.device_array` call (cuMemAlloc) per op would cost more than the op at batch 1. A buffer returns to
the list when the last view of it is dropped; kernels run in order on one stream, so reuse is safe.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from numba import cuda

_ITEM = 4  # float32
_ANCHOR = np.zeros(1, np.float32)  # stand-in storage: only its address and strides are ever used


class _Lease:
    """Owns one pooled buffer; returns it when the last DeviceTensor sharing it is collected."""

    __slots__ = ("buf", "pool")

    def __init__(self, buf: Any, pool: BufferPool | None) -> None:
        self.buf, self.pool = buf, pool

    def __del__(self) -> None:
        if self.pool is not None:
            self.pool.release(self.buf)


class BufferPool:
    def __init__(self) -> None:
        self.free: dict[int, list[Any]] = defaultdict(list)
        self.allocated_bytes = 0
        self.private: list[Any] | None = None  # set while a CUDA graph is captured: its own buffers

    def take(self, n: int) -> _Lease:
        n = max(n, 1)
        if self.private is not None:  # never back in the free list: the graph rewrites it at each replay
            self.allocated_bytes += n * _ITEM
            self.private.append(cuda.device_array(n, np.float32))
            return _Lease(self.private[-1], None)
        stack = self.free[n]
        if stack:
            return _Lease(stack.pop(), self)
        self.allocated_bytes += n * _ITEM
        return _Lease(cuda.device_array(n, np.float32), self)

    def release(self, buf: Any) -> None:
        self.free[buf.shape[0]].append(buf)


class DeviceTensor:
    """A float32 view into a flat device buffer. Kernels take (buf, offset, strides...) from it."""

    __slots__ = ("buf", "offset", "shape", "strides", "_lease")
    dtype = np.dtype(np.float32)

    def __init__(self, buf: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], lease=None):
        self.buf, self.offset = buf, offset
        self.shape, self.strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
        self._lease = lease

    @classmethod
    def contiguous(cls, buf: Any, shape: tuple[int, ...], lease: _Lease | None = None) -> DeviceTensor:
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
        return cls(buf, 0, shape, strides, lease)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def _standin(self) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(
            _ANCHOR, self.shape, tuple(s * _ITEM for s in self.strides), writeable=False
        )

    def _from_standin(self, base: np.ndarray, view: np.ndarray) -> DeviceTensor:
        delta = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        strides = tuple(s // _ITEM for s in view.strides)
        return DeviceTensor(self.buf, self.offset + delta // _ITEM, view.shape, strides, self._lease)

    def __getitem__(self, key: Any) -> DeviceTensor:
        base = self._standin()
        view = base[key]
        if not isinstance(view, np.ndarray) or any(s < 0 for s in view.strides):
            raise TypeError(f"DeviceTensor supports basic slicing with positive steps only, got {key!r}")
        return self._from_standin(base, view)

    def reshape(self, *shape: Any) -> DeviceTensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        base = self._standin()
        try:
            view = np.reshape(base, shape, copy=False)
        except ValueError as e:
            raise ValueError(f"reshape of device view {self.shape} -> {shape} would need a copy") from e
        return self._from_standin(base, view)

    def is_contiguous(self) -> bool:
        return self._standin().flags.c_contiguous

    def rows2d(self) -> tuple[Any, int, int]:
        """(buf, offset, row stride) of a [R, n] view with unit inner stride."""
        if self.ndim != 2 or (self.strides[1] != 1 and self.shape[1] > 1):
            raise ValueError(f"expected a 2-D view with unit inner stride, got {self.shape} {self.strides}")
        return self.buf, self.offset, self.strides[0]

    def heads3d(self) -> tuple[Any, int, int, int]:
        """(buf, offset, token stride, head stride) of a [T, H, d] view with unit inner stride."""
        if self.ndim != 3 or (self.strides[2] != 1 and self.shape[2] > 1):
            raise ValueError(f"expected a 3-D view with unit inner stride, got {self.shape} {self.strides}")
        return self.buf, self.offset, self.strides[0], self.strides[1]

    def to_host(self) -> np.ndarray:
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True)) if self.size else 0
        flat = self.buf[self.offset : self.offset + span].copy_to_host() if span else np.zeros(1, np.float32)
        view = np.lib.stride_tricks.as_strided(
            flat, self.shape, tuple(s * _ITEM for s in self.strides), writeable=False
        )
        return np.array(view, dtype=np.float32)

    def __repr__(self) -> str:
        return f"DeviceTensor(shape={self.shape}, strides={self.strides}, offset={self.offset})"
