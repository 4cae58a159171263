"""Device buffers inside NaN guards, for the CUDA kernel tests: a kernel that writes out of bounds turns a
guard row or column from NaN to a number. Importing this module makes the CUDA backend (a GPU, or the
simulator when NUMBA_ENABLE_CUDASIM=1 was set before numba was first imported)."""

from __future__ import annotations

import numpy as np

from edgellm.backends.cuda import get_cuda_backend
from edgellm.backends.cuda.devarray import DeviceTensor

GUARD = 2
BE = get_cuda_backend()


def guarded(host: np.ndarray) -> tuple[DeviceTensor, DeviceTensor]:
    """A device buffer holding `host` inside NaN guards on every side; returns (whole, interior view)."""
    shape = host.shape
    full = np.full(tuple(s + 2 * GUARD for s in shape), np.nan, np.float32)
    inner = tuple(slice(GUARD, GUARD + s) for s in shape)
    full[inner] = host
    whole = BE.from_host(full)
    return whole, whole[inner]


def guards_intact(whole: DeviceTensor, shape: tuple[int, ...]) -> bool:
    h = BE.to_host(whole)
    mask = np.ones(h.shape, bool)
    mask[tuple(slice(GUARD, GUARD + s) for s in shape)] = False
    return bool(np.isnan(h[mask]).all())
