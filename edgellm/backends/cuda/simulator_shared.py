"""The Numba CUDA simulator's shared arrays, made safe for the threads of one block.

The simulator runs each GPU thread as a Python thread and finds a block's `cuda.shared.array` by the
calling source line in a dict (FakeCUDAShared.array: get, then store if absent). A thread switch between
the get and the store lets two threads of a block each store an array of their own: each then writes
its own copy, the barriers order nothing, and the kernel reads uninitialised memory (seen as a
batch-invariance failure of the Q6_K matmul on a loaded host: the activation quantizer's tree reduction
read another lane's garbage). numba-cuda 0.30 has no lock there; `serialize_shared_arrays` replaces the
method with the same lookup under one lock. Only the simulator is patched: a GPU's shared memory is the
hardware's.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
from numba.core import types
from numba.np import numpy_support

_LOCK = threading.Lock()


def _shared_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> np.ndarray:
    """FakeCUDAShared.array with its lookup atomic; keyed, as the simulator does, by the caller's
    (file, line)."""
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:  # dynamic shared memory: one buffer every such call views
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    caller = sys._getframe(1)
    key = (caller.f_code.co_filename, caller.f_lineno)
    with _LOCK:
        res = self._allocations.get(key)
        if res is None:
            res = self._allocations[key] = np.empty(shape, dtype)
    return res


def serialize_shared_arrays() -> None:
    from numba.cuda.simulator import kernelapi

    kernelapi.FakeCUDAShared.array = _shared_array
