"""CUDA backend (Numba CUDA). Only the entry point exists until the CUDA issue lands."""

from __future__ import annotations


class CudaUnavailableError(RuntimeError):
    pass


def get_cuda_backend():  # -> Backend
    try:
        from numba import cuda
    except ImportError as e:  # pragma: no cover - numba is a core dependency
        raise CudaUnavailableError(f"CUDA backend needs numba's CUDA support: {e}") from e
    if not cuda.is_available():
        raise CudaUnavailableError(
            "CUDA backend requested but no usable NVIDIA GPU/driver was found (numba.cuda.is_available() "
            "is False); use backend='cpu'"
        )
    raise CudaUnavailableError("the CUDA backend is not implemented yet in this version; use backend='cpu'")
