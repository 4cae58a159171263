"""The backends the model code runs on, by name. Each is imported only when asked for, so choosing the CPU
never loads Numba's CUDA support and a front-end that only names a backend loads none."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgellm.backends.base import Backend


def _cpu() -> Backend:
    from edgellm.backends.cpu.backend import CpuBackend

    return CpuBackend()


def _cuda() -> Backend:
    from edgellm.backends.cuda import get_cuda_backend

    return get_cuda_backend()


BACKENDS: dict[str, Callable[[], Backend]] = {"cpu": _cpu, "cuda": _cuda}


def get_backend(name: str = "cpu") -> Backend:
    make = BACKENDS.get(name)
    if make is None:
        raise ValueError(f"unknown backend {name!r} (available: {', '.join(BACKENDS)})")
    return make()
