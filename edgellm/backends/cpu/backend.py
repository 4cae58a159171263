"""The CPU backend: numpy arrays and Numba kernels."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numba
import numpy as np

from edgellm.backends.base import Backend, ExpertRoute, StepIndex, StepInputs
from edgellm.backends.cpu import layernorm_gelu, ops, silu_ir, tiers
from edgellm.backends.cpu.attention import attention_paged_cpu
from edgellm.backends.cpu.kv_cache import CpuKvCache
from edgellm.backends.cpu.layer import FusedLayer, decoder_layer_cpu, pack_layer
from edgellm.backends.cpu.matmul import matmul_cpu
from edgellm.backends.cpu.moe.block import run_moe_block
from edgellm.backends.cpu.moe.experts import moe_combine_cpu, run_moe_experts
from edgellm.backends.cpu.moe.route import route_cpu
from edgellm.backends.cpu.packed import PackedWeight, dequantize_rows_cpu, pack_tiles, pack_weight
from edgellm.backends.cpu.tile_layouts import TILE, TILE_LAYOUTS
from edgellm.gguf.reader import TensorInfo
from edgellm.gguf.rope import RopeParams
from edgellm.quants.kv_cache import get_kv_cache_type
from edgellm.quants.packing import Tiles, stack_packed, stackable
from edgellm.quants.traits import get_traits


class StackedWeights:
    """Matrices that could not be stacked (different repacked forms): one matmul each into column slices."""

    def __init__(self, parts: list[PackedWeight]) -> None:
        self.parts = parts
        self.rows = sum(p.rows for p in parts)
        self.cols = parts[0].cols


def _tile_runs(tensors: list[TensorInfo]) -> list[list[TensorInfo]]:
    """Consecutive tensors that can share one tiled weight: the same type, and every one but the last
    with whole tiles (a tile never mixes two matrices)."""
    runs: list[list[TensorInfo]] = []
    for t in tensors:
        last = runs[-1] if runs else None
        if last and last[-1].qtype == t.qtype and last[-1].shape[0] % TILE == 0:
            last.append(t)
        else:
            runs.append([t])
    return runs


# the row-parallel kernel of each gated activation kind (ModelConfig.activation)
GATED_ACTS = {"silu": ops.swiglu_par_cpu, "gelu": ops.geglu_par_cpu, "swiglu_oai": ops.swiglu_oai_par_cpu}
NO_SINKS = np.empty(0, np.float32)  # attention without sinks: attention_paged_cpu's empty array


class CpuBackend(Backend):
    name = "cpu"
    attention_sinks = True

    def __init__(self, tier: str | None = None) -> None:
        # The kernel tier (tiers.py): the active one, or a named one this process's kernels hold (tests).
        # CpuTierError names the problem for an EDGELLM_CPU_TIER the host cannot run.
        self.tier = tiers.check_compiled(tiers.active_tier() if tier is None else tiers.by_name(tier))
        # Numba's thread count when the backend is made (the engine sets it first); asked once, not per call.
        self.n_threads = numba.get_num_threads()
        self._rope_tables: dict[RopeParams, tuple[np.ndarray, np.ndarray]] = {}
        # Whole decoder layers in one kernel call where they can be (layer.py); EDGELLM_NO_FUSED_LAYERS=1
        # runs them kernel by kernel (the same bits, more calls). Read when the model is loaded.
        self.fuse_layers = os.environ.get("EDGELLM_NO_FUSED_LAYERS", "") in ("", "0")
        self._fused_step: tuple = ()  # (x, kv, inputs) of the step decoder_layer last checked
        self._positions_end = 0  # that step's largest position + 1
        self._fused_kv: tuple = ()  # (cache, n_kv, d, dv) decoder_layer last checked

    def load_matrix(self, tensors: list[TensorInfo]) -> Any:
        for t in tensors:
            get_traits(t.qtype, t.name)  # clear error for unsupported types, naming the tensor
        if self.tier.tiles is not None and all(t.qtype in TILE_LAYOUTS for t in tensors):
            # Straight from the file's blocks to the tiles, a chunk of rows at a time; consecutive
            # matrices of one type (Q|K, gate|up) share one weight, so one kernel call serves them.
            runs = _tile_runs(tensors)
            parts = [
                pack_tiles(run[0].qtype, [t.data for t in run], run[0].shape[1], run[0].name, self.huge_pages)
                for run in runs
            ]
            return parts[0] if len(parts) == 1 else StackedWeights(parts)
        parts = [pack_weight(t.qtype, t.data, *t.shape) for t in tensors]
        if len(parts) == 1:
            return parts[0]
        if stackable(parts):
            return stack_packed(parts)
        return StackedWeights(parts)

    def load_matrices(self, groups: list[list[TensorInfo]]) -> list[Any]:
        # Matrices of one type and width with whole tiles (a layer's experts): one pack_tiles over all
        # their rows, whose thread pool and chunks then span every matrix (repacking them one by one
        # costs ~3x), and each group a view of its own tiles, the same tiles its own load_matrix gives.
        flat = [t for g in groups for t in g]
        first = flat[0] if flat else None
        if (
            self.tier.tiles is None or first is None or first.qtype not in TILE_LAYOUTS
            or any(t.qtype != first.qtype or t.shape[1] != first.shape[1] or t.shape[0] % TILE for t in flat)
        ):  # fmt: skip
            return super().load_matrices(groups)
        whole = pack_tiles(first.qtype, [t.data for t in flat], first.shape[1], first.name, self.huge_pages)
        views, t0 = [], 0
        for g in groups:
            rows = sum(t.shape[0] for t in g)
            tiles = Tiles(*(p[t0 : t0 + rows // TILE] for p in whole.tiles.planes), whole.tiles.layout_id)
            views.append(dataclasses.replace(whole, rows=rows, tiles=tiles))
            t0 += rows // TILE
        return views

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

    def embed(self, w: Any, ids: np.ndarray | StepIndex, scale: float) -> np.ndarray:
        ids = ids.host if isinstance(ids, StepIndex) else ids
        x = dequantize_rows_cpu(w, np.asarray(ids, dtype=np.int64))
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def matmul(self, x: np.ndarray, w: Any, out: np.ndarray) -> None:
        if isinstance(w, StackedWeights):
            c = 0
            x = np.ascontiguousarray(x)
            for p in w.parts:  # each part writes its columns of out in place
                matmul_cpu(x, p, out[:, c : c + p.rows], self.n_threads, self.tier.index)
                c += p.rows
            return
        matmul_cpu(np.ascontiguousarray(x), w, out, self.n_threads, self.tier.index)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
        ops.rmsnorm_cpu(x, w, eps, out)

    def rmsnorm_heads(self, x: np.ndarray, w: np.ndarray, eps: float) -> None:
        ops.rmsnorm_heads_cpu(x, w, eps)

    def rope(self, x: np.ndarray, positions: np.ndarray, rope: RopeParams) -> None:
        if len(positions) == 0:
            return
        table = self._rope_table(rope, int(positions.max()) + 1)
        ops.rope_cached_cpu(x, positions, table[0], table[1], rope.neox)

    def _rope_table(self, rope: RopeParams, need: int) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin tables of `rope` covering positions 0 .. need - 1."""
        table = self._rope_tables.get(rope)
        if table is None or table[0].shape[0] < need:  # grow by doubling: positions only go up to n_ctx
            size = max(need, 2 * table[0].shape[0] if table is not None else 1024)
            table = self._rope_tables[rope] = ops.rope_tables(size, rope)
        return table

    def gated_act(self, gate_up: np.ndarray, out: np.ndarray, kind: str) -> None:
        # A parallel region costs more than the work for a few rows (decode), and pays from ~8 rows on.
        parallel = gate_up.shape[0] >= 8
        if kind == "silu" and self.tier.tiles is not None and gate_up.strides[1] == 4 and out.strides[1] == 4:
            # ggml's AVX-512 vectorised silu, bit for bit, on every tile tier
            kernel = silu_ir.swiglu_vec_par_cpu if parallel else silu_ir.swiglu_vec_cpu
            kernel(gate_up, out, self.tier.index)
        else:
            # Always the row-parallel kernel: LLVM vectorises exp/tanh differently in the serial one, so a
            # row's bits would depend on the batch's size (speculative decoding's verify must score a token
            # exactly as its decode would). The region costs ~2 us per call at one row.
            GATED_ACTS[kind](gate_up, out)

    def moe_route(self, logits: np.ndarray, k: int, gating: str, renormalise: bool) -> ExpertRoute | None:
        return route_cpu(logits, k, gating, renormalise)

    def moe_experts(
        self, h: np.ndarray, route: ExpertRoute, experts: Any, activation: str, outs: np.ndarray
    ) -> bool:
        if self.tier.tiles is None:
            return False  # the portable tier: expert by expert
        return run_moe_experts(h, route, experts, activation, outs, self.n_threads, self.tier.index)

    def moe_block(self, x: np.ndarray, w: Any, cfg: Any) -> bool:
        if self.tier.tiles is None:
            return False  # the portable tier: step by step
        return run_moe_block(x, w, cfg, self.n_threads, self.tier.index)

    def moe_combine(self, outs: np.ndarray, where: np.ndarray, weights: np.ndarray) -> np.ndarray:
        if where.ndim != 2 or where.shape[1] == 0 or weights.shape != where.shape or outs.ndim != 2:
            raise ValueError(f"MoE combine of {outs.shape} outputs by {where.shape} / {weights.shape} slots")
        out = np.empty((where.shape[0], outs.shape[1]), np.float32)
        if not moe_combine_cpu(
            np.ascontiguousarray(outs, np.float32), np.ascontiguousarray(where, np.int64),
            np.ascontiguousarray(weights, np.float32), out,
        ):  # fmt: skip
            raise ValueError(f"MoE combine: a slot's row outside the {outs.shape[0]} expert outputs")
        return out

    def layernorm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, out: np.ndarray) -> None:
        layernorm_gelu.layernorm_cpu(x, w, b, eps, out)

    def gelu(self, x: np.ndarray) -> None:
        layernorm_gelu.gelu_cpu(x)

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        ops.add_cpu(x, y)

    def add_bias(self, x: np.ndarray, b: np.ndarray) -> None:
        x += b

    def alloc_kv(
        self, n_layers: int, n_blocks: int, block_size: int, n_kv: int, d: int, dv: int, dtype: str = "f16"
    ) -> CpuKvCache:
        get_kv_cache_type(dtype).check_head_dims(d, dv)
        return CpuKvCache(dtype, n_layers, n_blocks, block_size, n_kv, d, dv)

    def write_kv(self, kv: CpuKvCache, layer: int, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> None:
        kv.kernels.write(k, v, *kv.layers[layer], slots)

    def copy_blocks(self, kv: CpuKvCache, pairs: list[tuple[int, int]]) -> None:
        src = np.asarray([p[0] for p in pairs])
        dst = np.asarray([p[1] for p in pairs])
        for k_cache, v_cache in kv.layers:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]

    def read_kv_block(self, kv: CpuKvCache, block: int) -> bytes:
        return b"".join(a[block].tobytes() for layer in kv.layers for a in layer)

    def write_kv_block(self, kv: CpuKvCache, block: int, payload: bytes) -> None:
        at = 0
        for layer in kv.layers:
            for a in layer:
                n = a[block].nbytes
                a[block] = np.frombuffer(payload, a.dtype, a[block].size, at).reshape(a.shape[1:])
                at += n
        if at != len(payload):
            raise ValueError(f"a KV block is {at} bytes here, the payload {len(payload)}")

    def attention(
        self,
        q: np.ndarray,
        kv: CpuKvCache,
        layer: int,
        block_tables: np.ndarray,
        seq_index: np.ndarray,
        positions: np.ndarray,
        window: int,
        scale: float,
        out: np.ndarray,
        softcap: float = 0.0,
        sinks: np.ndarray | None = None,
    ) -> None:
        k_cache, v_cache = kv.layers[layer]
        if sinks is None:
            sinks = NO_SINKS
        elif sinks.shape != (q.shape[1],):  # the kernel reads sinks[h] for every head h unchecked
            raise ValueError(f"attention sinks of shape {sinks.shape} for {q.shape[1]} heads")
        attention_paged_cpu(
            np.ascontiguousarray(q), k_cache, v_cache, block_tables, seq_index, positions, window, scale,
            softcap, sinks, numba.get_num_threads(), out,
        )  # fmt: skip

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        x *= np.float32(s)
        return x

    def prepare_layer(self, cfg: Any, attn: Any, ffn: Any, layer: int) -> FusedLayer | None:
        if not (self.fuse_layers and self.tier.fused_layer):
            return None
        return pack_layer(cfg, attn, ffn, layer)

    def decoder_layer(
        self, fused: FusedLayer, x: np.ndarray, kv: CpuKvCache, layer: int, inp: StepInputs
    ) -> bool:
        step = self._fused_step
        checked = step and step[0] is x and step[1] is kv and step[2] is inp
        if not checked and not self._check_fused_step(fused, x, kv, inp):
            return False
        k_cache, v_cache = kv.layers[layer]
        cos_t, sin_t = self._rope_table(fused.rope, self._positions_end)
        decoder_layer_cpu(
            x, fused.norms, fused.biases, fused.planes, fused.meta, fused.dims, fused.eps, fused.scale,
            fused.softcap, fused.residual, fused.sinks, cos_t, sin_t, k_cache, v_cache, inp.block_tables,
            inp.seq_index, inp.positions, inp.slots, self.n_threads, self.tier.index,
        )  # fmt: skip
        return True

    def _check_fused_step(self, fused: FusedLayer, x: np.ndarray, kv: CpuKvCache, inp: StepInputs) -> bool:
        """Whether decoder_layer_cpu can run this step: every shape it assumes of the activations, the
        step's index arrays and the cache (the weights' were checked by pack_layer; every layer of a model
        has the same head and cache geometry). Checked once per step, not per layer."""
        positions, slots, seq_index, tables = inp.positions, inp.slots, inp.seq_index, inp.block_tables
        T = x.shape[0]
        ok = (
            T > 0 and x.ndim == 2 and x.shape[1] == fused.n_embd
            and x.dtype == np.float32 and x.flags.c_contiguous
            and positions.shape == (T,) and slots.shape == (T,) and seq_index.shape == (T,)
            and positions.dtype == np.int32 and slots.dtype == np.int64 and seq_index.dtype == np.int32
            and tables.ndim == 2 and tables.dtype == np.int32
            and self._check_fused_kv(fused, kv)
        )  # fmt: skip
        if ok:
            self._fused_step = (x, kv, inp)
            self._positions_end = int(positions.max()) + 1
        return ok

    def _check_fused_kv(self, fused: FusedLayer, kv: CpuKvCache) -> bool:
        """An f16 cache whose every layer has the model's head geometry (once per cache and geometry)."""
        n_kv, d, dv = (int(n) for n in fused.dims[1:4])
        key = (kv, n_kv, d, dv)
        if self._fused_kv == key:
            return True
        ok = kv.dtype == "f16" and all(
            k.shape[1:3] == (n_kv, d) and v.shape[2:] == (n_kv, dv) for k, v in kv.layers
        )
        if ok:
            self._fused_kv = key
        return ok
