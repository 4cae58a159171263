"""The CPU backend: numpy arrays and Numba kernels."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from edgellm.backends.base import Backend
from edgellm.backends.cpu import ops, silu_avx512, vnni
from edgellm.backends.cpu.attention import attention_paged_cpu
from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.packed import (
    PackedWeight,
    dequantize_rows_cpu,
    pack_weight,
    pack_weight_tiled,
    tile_packed,
)
from edgellm.gguf.reader import TensorInfo
from edgellm.quants.packing import stack_packed, stackable
from edgellm.quants.traits import get_traits


class StackedWeights:
    """Matrices that could not be stacked (different repacked forms): one matmul each into column slices."""

    def __init__(self, parts: list[PackedWeight]) -> None:
        self.parts = parts
        self.rows = sum(p.rows for p in parts)
        self.cols = parts[0].cols


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self) -> None:
        self._rope_tables: dict[tuple[int, float], tuple[np.ndarray, np.ndarray]] = {}

    def load_matrix(self, tensors: list[TensorInfo]) -> Any:
        for t in tensors:
            get_traits(t.qtype, t.name)  # clear error for unsupported types, naming the tensor
        if len(tensors) == 1 and vnni.VNNI_ACTIVE:  # straight to the tiles, a chunk of rows at a time
            t = tensors[0]
            return pack_weight_tiled(t.qtype, t.data, *t.shape)
        parts = [pack_weight(t.qtype, t.data, *t.shape) for t in tensors]
        # On VNNI hosts the int8 rows move to the tile16 layout after stacking (no second copy is kept).
        layout = tile_packed if vnni.VNNI_ACTIVE else (lambda w: w)
        if len(parts) == 1:
            return parts[0]
        if stackable(parts):
            return layout(stack_packed(parts))
        return StackedWeights([layout(p) for p in parts])

    def load_vector(self, tensor: TensorInfo) -> np.ndarray:
        get_traits(tensor.qtype, tensor.name)
        n = int(np.prod(tensor.shape))
        w = pack_weight(tensor.qtype, tensor.data.reshape(1, -1), 1, n)
        return np.ascontiguousarray(dequantize_rows_cpu(w, np.zeros(1, np.int64))[0], dtype=np.float32)

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, dtype=np.float32)

    def contiguous(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def from_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def embed(self, w: Any, ids: np.ndarray, scale: float) -> np.ndarray:
        x = dequantize_rows_cpu(w, np.asarray(ids, dtype=np.int64))
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def matmul(self, x: np.ndarray, w: Any, out: np.ndarray) -> None:
        if isinstance(w, StackedWeights):
            c = 0
            for p in w.parts:
                part = np.empty((x.shape[0], p.rows), np.float32)
                matmul_cpu(x, p, part)
                out[:, c : c + p.rows] = part
                c += p.rows
            return
        matmul_cpu(np.ascontiguousarray(x), w, out)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
        ops.rmsnorm_cpu(x, w, eps, out)

    def rmsnorm_heads(self, x: np.ndarray, w: np.ndarray, eps: float) -> None:
        ops.rmsnorm_heads_cpu(x, w, eps)

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, neox: bool) -> None:
        if len(positions) == 0:
            return
        key = (n_rot, float(base))
        table = self._rope_tables.get(key)
        need = int(positions.max()) + 1
        if table is None or table[0].shape[0] < need:  # grow by doubling: positions only go up to n_ctx
            size = max(need, 2 * table[0].shape[0] if table is not None else 1024)
            table = self._rope_tables[key] = ops.rope_table_cpu(size, n_rot, float(base))
        ops.rope_cached_cpu(x, positions, table[0], table[1], neox)

    def gated_act(self, gate_up: np.ndarray, out: np.ndarray, kind: str) -> None:
        # A parallel region costs more than the work for a few rows (decode), and pays from ~8 rows on.
        parallel = gate_up.shape[0] >= 8
        if kind != "gelu" and vnni.VNNI_ACTIVE and gate_up.strides[1] == 4 and out.strides[1] == 4:
            # ggml's vectorised silu, bit for bit (VNNI hosts have AVX-512F)
            (silu_avx512.swiglu_avx512_par_cpu if parallel else silu_avx512.swiglu_avx512_cpu)(gate_up, out)
        else:
            # Always the row-parallel kernel: LLVM vectorises exp/tanh differently in the serial one, so a
            # row's bits would depend on the batch's size (speculative decoding's verify must score a token
            # exactly as its decode would). The region costs ~2 us per call at one row.
            (ops.geglu_par_cpu if kind == "gelu" else ops.swiglu_par_cpu)(gate_up, out)

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        ops.add_cpu(x, y)

    def add_bias(self, x: np.ndarray, b: np.ndarray) -> None:
        x += b

    def alloc_kv(self, n_layers: int, n_blocks: int, block_size: int, n_kv: int, d: int, dv: int) -> Any:
        return [
            (
                # f16 bits (as llama.cpp's f16 cache); K transposed per block (attention.py)
                np.zeros((n_blocks, n_kv, d, block_size), np.uint16),
                np.zeros((n_blocks, block_size, n_kv, dv), np.uint16),
            )
            for _ in range(n_layers)
        ]

    def write_kv(self, kv: Any, layer: int, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> None:
        k_cache, v_cache = kv[layer]
        ops.write_kv_cpu(k, v, k_cache, v_cache, slots)

    def copy_blocks(self, kv: Any, pairs: list[tuple[int, int]]) -> None:
        src = np.asarray([p[0] for p in pairs])
        dst = np.asarray([p[1] for p in pairs])
        for k_cache, v_cache in kv:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]

    def attention(
        self,
        q: np.ndarray,
        kv: Any,
        layer: int,
        block_tables: np.ndarray,
        seq_index: np.ndarray,
        positions: np.ndarray,
        window: int,
        scale: float,
        out: np.ndarray,
    ) -> None:
        k_cache, v_cache = kv[layer]
        attention_paged_cpu(
            np.ascontiguousarray(q), k_cache, v_cache, block_tables, seq_index, positions, window, scale,
            numba.get_num_threads(), out,
        )  # fmt: skip
