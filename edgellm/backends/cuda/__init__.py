"""CUDA backend (Numba CUDA). `get_cuda_backend()` returns it, or raises CudaUnavailableError with the reason
when no usable GPU/driver is present. Under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set before
numba is imported) it returns the backend so the kernels can be tested on machines without a GPU."""

from __future__ import annotations

from typing import Any


class CudaUnavailableError(RuntimeError):
    pass


def get_cuda_backend() -> Any:  # -> CudaBackend
    try:
        from numba import config, cuda
    except ImportError as e:  # pragma: no cover - numba is a core dependency
        raise CudaUnavailableError(f"CUDA backend needs numba's CUDA support: {e}") from e
    if not config.ENABLE_CUDASIM:
        try:
            available = cuda.is_available()
        except Exception as e:  # noqa: BLE001 - a broken driver install raises various errors
            raise CudaUnavailableError(f"CUDA backend requested but the CUDA driver failed: {e}") from e
        if not available:
            raise CudaUnavailableError(
                "CUDA backend requested but no usable NVIDIA GPU/driver was found (numba.cuda.is_available() "
                "is False; install the NVIDIA driver and the numba-cuda package, or use backend='cpu')"
            )
    try:
        from edgellm.backends.cuda.backend import CudaBackend
    except ImportError as e:
        raise CudaUnavailableError(f"CUDA backend needs the numba-cuda package: {e}") from e
    return CudaBackend()
