"""The backend interface the model code is written against.

A backend owns where weights and activations live (numpy on the CPU, device arrays on CUDA) and the
kernels over them. Model files (`edgellm/arch/`) call only these methods, so a new backend needs no change
to the models, the engine, the server or the TUI.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from edgellm.gguf.reader import TensorInfo

Array = Any  # numpy array on the CPU backend, device array on CUDA


class Backend(ABC):
    name: str

    # --- weights -------------------------------------------------------------------------------------
    @abstractmethod
    def load_matrix(self, tensors: list[TensorInfo]) -> Any:
        """Repack one weight matrix, or several stacked along the output rows (fused QKV, gate|up)."""

    @abstractmethod
    def load_vector(self, tensor: TensorInfo) -> Array:
        """A float32 vector (norm weights, biases)."""

    # --- activations -----------------------------------------------------------------------------------
    @abstractmethod
    def empty(self, shape: tuple[int, ...]) -> Array:
        """Uninitialised float32 activations."""

    @abstractmethod
    def contiguous(self, x: Array) -> Array:
        """x as a C-contiguous array (a copy only when it is a strided view)."""

    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray: ...

    @abstractmethod
    def from_host(self, x: np.ndarray) -> Array: ...

    # --- kernels -------------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, w: Any, ids: np.ndarray, scale: float) -> Array:
        """Rows `ids` of a weight matrix as float32 [T, K], times `scale`."""

    @abstractmethod
    def matmul(self, x: Array, w: Any, out: Array) -> None:
        """out[M, N] = x[M, K] @ W[N, K].T"""

    @abstractmethod
    def rmsnorm(self, x: Array, w: Array, eps: float, out: Array) -> None: ...

    @abstractmethod
    def rmsnorm_heads(self, x: Array, w: Array, eps: float) -> None:
        """In place over [T, H, d] with a [d] weight."""

    @abstractmethod
    def rope(self, x: Array, positions: Array, n_rot: int, base: float, neox: bool) -> None: ...

    @abstractmethod
    def gated_act(self, gate_up: Array, out: Array, kind: str) -> None:
        """out = act(gate) * up for gate_up = [gate | up]; kind is 'silu' or 'gelu'."""

    @abstractmethod
    def add(self, x: Array, y: Array) -> None:
        """x += y"""

    @abstractmethod
    def add_bias(self, x: Array, b: Array) -> None:
        """x[t] += b for every row"""

    @abstractmethod
    def alloc_kv(self, n_layers: int, n_blocks: int, block_size: int, n_kv: int, d: int, dv: int) -> Any:
        """Paged KV storage: per layer, K [n_blocks, block_size, n_kv, d] and V [..., dv]."""

    @abstractmethod
    def write_kv(self, kv: Any, layer: int, k: Array, v: Array, slots: Array) -> None: ...

    @abstractmethod
    def copy_blocks(self, kv: Any, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (copy-on-write)."""

    @abstractmethod
    def attention(
        self,
        q: Array,
        kv: Any,
        layer: int,
        block_tables: Array,
        seq_index: Array,
        positions: Array,
        window: int,
        scale: float,
        out: Array,
    ) -> None: ...


def get_backend(name: str = "cpu") -> Backend:
    if name == "cpu":
        from edgellm.backends.cpu.backend import CpuBackend

        return CpuBackend()
    if name == "cuda":
        from edgellm.backends.cuda import get_cuda_backend

        return get_cuda_backend()
    raise ValueError(f"unknown backend {name!r} (available: cpu, cuda)")
