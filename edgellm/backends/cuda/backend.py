"""The CUDA backend: the CPU backend's interface over device memory and Numba CUDA kernels.

Weights are repacked on the host with the CPU backend's packer (same int8-grouped values, so both backends
compute the same dot products) and uploaded once. Activations are DeviceTensor views from a buffer pool;
token ids, positions, block tables and slots go up each step; what comes back is the logits rows the host
asks for, or, when the engine samples on the device (argmax / top_k), only token ids (and the k best logits).
Every launch and copy is counted in STATS (config.KernelStats).

Launch overhead: at batch 1 a launch from Python costs more than its work, so the backend defers an op
whose output the next op of a layer consumes and launches them as one fused kernel (deferred.py, fused.py):
[post-norm +] residual add + the next RMSNorm + quantizing its output for the matmul; gated activation +
quantizing; attention + quantizing; [Q/K norms +] RoPE of Q and K + the K/V cache write. A SmolLM2 or
Gemma 3 layer then takes 9 launches at decode instead of 17 / 21. An op that cannot fuse launches the
deferred one first, so effects keep the model's order. EDGELLM_CUDA_FUSE=0 turns it off (tests compare
both: the same bits).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from numba import cuda

from edgellm.backends.base import Backend, StepInputs
from edgellm.backends.cuda import attention as attn
from edgellm.backends.cuda import graphs, layernorm_gelu, ops
from edgellm.backends.cuda.config import (
    ATTN_SPLIT_KEYS,
    ROW_THREADS,
    STATS,
    elem_grid,
    launch,
    stream,
)
from edgellm.backends.cuda.deferred import ActOp, AttnOp, HeadsOp, ResidualOp, same_view
from edgellm.backends.cuda.devarray import BufferPool, DeviceTensor
from edgellm.backends.cuda.device_sampling import DeviceSampling
from edgellm.backends.cuda.kv_cache import DeviceKvCache
from edgellm.backends.cuda.matmul import DeviceWeight, Scratch, gather_rows_cuda, matmul_cuda, upload_weight
from edgellm.backends.cuda.step_inputs import StepIndex, StepUploader
from edgellm.gguf.reader import TensorInfo
from edgellm.gguf.rope import RopeParams
from edgellm.quants.kv_cache import get_kv_cache_type
from edgellm.quants.packing import dequantize_packed, pack_weight, stack_packed, stackable
from edgellm.quants.traits import get_traits


class DeviceStacked:
    """Matrices with different repacked forms stacked along the output rows: one matmul each, written into
    column slices of the output."""

    def __init__(self, parts: list[DeviceWeight]) -> None:
        self.parts = parts
        self.rows = sum(p.rows for p in parts)
        self.cols = parts[0].cols


class CudaBackend(DeviceSampling, Backend):
    name = "cuda"
    samples_on_device = True  # argmax / top_k run on the device: the engine asks for ids, not logits
    attention_sinks = True

    def __init__(self) -> None:
        self.pool = BufferPool()
        self.scratch = Scratch()
        self.weight_bytes = 0
        self.stats = STATS
        self.fuse = os.environ.get("EDGELLM_CUDA_FUSE", "1") != "0"
        self.split_keys = ATTN_SPLIT_KEYS  # split-K attention above this many keys per token; 0: never
        self._pending: ResidualOp | ActOp | AttnOp | HeadsOp | None = None
        self._steps = StepUploader()
        self._argmax_zeroed: dict[int, bool] = {}  # rows -> its completion counters were zeroed
        self._graphs: dict[tuple, graphs.CapturedStep] = {}  # decode steps captured per shape (argmax_graph)
        self._fixed_inputs: StepInputs | None = None
        self._rope_freqs: dict[RopeParams, Any] = {}  # device float64 [n_rot/2] per layer kind (rope)

    def _flush(self) -> None:
        """Launch the deferred op on its own: the next op does not consume it."""
        op, self._pending = self._pending, None
        if op is not None:
            op.launch(self.scratch)

    def _upload(self, x: np.ndarray) -> Any:
        self.stats.count_from_host(x.nbytes)
        return cuda.to_device(x)

    def _download(self, d: Any) -> np.ndarray:
        out = d.copy_to_host(stream=stream())
        stream().synchronize()
        self.stats.count_to_host(out.nbytes)
        return out

    def step_inputs(self, batch: Any) -> StepInputs:
        """The step's index arrays in one copy (step_inputs.py); inside argmax_graph, the ones it sent."""
        self._flush()
        return self._fixed_inputs if self._fixed_inputs is not None else self._steps.upload(batch)

    # --- weights -------------------------------------------------------------------------------------
    def load_matrix(self, tensors: list[TensorInfo]) -> DeviceWeight | DeviceStacked:
        parts = []
        for t in tensors:
            get_traits(t.qtype, t.name)
            rows, cols = t.shape
            parts.append(pack_weight(t.qtype, t.data, rows, cols, name=t.name))
        if len(parts) > 1 and stackable(parts):
            parts = [stack_packed(parts)]
        uploaded = [upload_weight(p) for p in parts]  # host copies are dropped here
        self.weight_bytes += sum(w.nbytes for w in uploaded)
        return uploaded[0] if len(uploaded) == 1 else DeviceStacked(uploaded)

    def load_vector(self, tensor: TensorInfo) -> DeviceTensor:
        get_traits(tensor.qtype, tensor.name)
        n = int(np.prod(tensor.shape))
        w = pack_weight(tensor.qtype, tensor.data.reshape(1, -1), 1, n)
        host = np.ascontiguousarray(dequantize_packed(w)[0], dtype=np.float32)
        return self.from_host(host)

    # --- activations -----------------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...]) -> DeviceTensor:
        shape = tuple(int(s) for s in shape)
        lease = self.pool.take(int(np.prod(shape)))
        return DeviceTensor.contiguous(lease.buf, shape, lease)

    def contiguous(self, x: DeviceTensor) -> DeviceTensor:
        self._flush()
        if x.is_contiguous():
            return x
        out = self.empty(x.shape)
        if x.ndim == 2:
            T, H, d, (buf, off, st), sh = x.shape[0], 1, x.shape[1], x.rows2d(), 0
        else:
            (T, H, d), (buf, off, st, sh) = x.shape, x.heads3d()
        grid, threads = elem_grid(T * H * d)
        if out.size:
            launch(ops.copy_strided_cuda, grid, threads, buf, off, st, sh, T, H, d, out.buf)
        return out

    def to_host(self, x: Any) -> np.ndarray:
        self._flush()
        if isinstance(x, DeviceTensor):
            out = x.to_host()
            self.stats.count_to_host(out.nbytes)
            return out
        return self._download(x) if hasattr(x, "copy_to_host") else np.asarray(x)

    def from_host(self, x: np.ndarray) -> Any:
        x = np.ascontiguousarray(x)
        if x.dtype == np.float32:  # activations: a pooled DeviceTensor the kernels can view
            t = self.empty(x.shape)
            if x.size:
                t.buf[: x.size].copy_to_device(x.reshape(-1))
                self.stats.count_from_host(x.nbytes)
            return t
        return self._upload(x)  # int arrays: positions, block tables, slots

    # --- kernels -------------------------------------------------------------------------------------
    def embed(self, w: Any, ids: np.ndarray | StepIndex, scale_f: float) -> DeviceTensor:
        self._flush()
        dev_ids = ids.dev if isinstance(ids, StepIndex) else None
        ids = ids.host if isinstance(ids, StepIndex) else np.ascontiguousarray(ids, dtype=np.int32)
        if ids.size and (ids.min() < 0 or ids.max() >= w.rows):
            raise IndexError(f"row ids out of range [0, {w.rows})")
        out = self.empty((len(ids), w.cols))
        if ids.size:
            flat = out.buf[: out.size].reshape(len(ids), w.cols)
            is_dense = w.dense is not None
            # placeholders of fixed types for the unused branch
            q = self.scratch.get("dummy_q", (1, 1), np.int32) if is_dense else w.q
            scale = self.scratch.get("dummy_s", (1, 1), np.float32) if is_dense else w.scale
            minv = w.minv if w.minv is not None else scale
            dense = w.dense if is_dense else scale
            grid, threads = elem_grid(out.size)
            launch(
                gather_rows_cuda,
                grid,
                threads,
                q,
                scale,
                minv,
                w.minv is not None,
                max(w.group, 1),
                dense,
                is_dense,
                dev_ids if dev_ids is not None else self._upload(ids),
                np.float32(scale_f),
                flat,
            )
        return out

    def matmul(self, x: DeviceTensor, w: Any, out: DeviceTensor) -> None:
        parts = w.parts if isinstance(w, DeviceStacked) else [w]
        xquant, qw = None, next((p for p in parts if p.dense is None), None)
        op = self._pending
        if isinstance(op, ResidualOp | ActOp | AttnOp) and op.produces(x):
            self._pending = None
            xquant = op.launch(self.scratch, qw)  # the producer quantizes x for the first quantized part
        else:
            self._flush()
        c = 0
        for p in parts:
            reuse = (
                xquant is not None and p.dense is None and (p.group, p.act_mode) == (qw.group, qw.act_mode)
            )
            if p.dense is None and not reuse:
                xquant = None  # p quantizes x for itself into the same scratch: the fused copy is gone
            view = out[:, c : c + p.rows] if len(parts) > 1 else out
            matmul_cuda(x, p, view, self.scratch, xquant if reuse else None)
            c += p.rows

    def rmsnorm(self, x: DeviceTensor, w: DeviceTensor, eps: float, out: DeviceTensor) -> None:
        op = self._pending
        if isinstance(op, ResidualOp) and op.w is None and same_view(op.x, x):
            op.w, op.eps, op.out = w, eps, out  # the residual add's result feeds this norm
            return
        self._flush()
        if self.fuse:
            self._pending = ResidualOp(x, w=w, eps=eps, out=out)
            return
        rows, n = x.shape
        if rows:
            launch(ops.rmsnorm_cuda, rows, ROW_THREADS, *x.rows2d(), w.buf, float(eps), n, *out.rows2d())

    def rmsnorm_heads(self, x: DeviceTensor, w: DeviceTensor, eps: float) -> None:
        self._heads_step(("norm", x, w, eps))

    def rope(self, x: DeviceTensor, positions: Any, rope: RopeParams) -> None:
        inv_freq = self._rope_freqs.get(rope)
        if inv_freq is None:  # once per layer kind (the first step, before any graph capture)
            inv_freq = self._rope_freqs[rope] = self._upload(rope.inv_freq())
        self._heads_step(("rope", x, positions, rope, inv_freq))

    def _heads_step(self, step: tuple) -> None:
        """Q/K norm and RoPE steps join the held HeadsOp while they follow its pattern (deferred.py)."""
        op = self._pending
        if isinstance(op, HeadsOp) and op.accepts(step):
            op.steps.append(step)
            return
        self._flush()
        op = HeadsOp([step])
        if self.fuse:
            self._pending = op
        else:
            op.launch(self.scratch)

    def gated_act(self, gate_up: DeviceTensor, out: DeviceTensor, kind: str) -> None:
        act = ops.GATED_ACTS.get(kind)
        if act is None:
            raise ValueError(f"gated activation {kind!r} is not implemented on the CUDA backend")
        self._flush()
        if self.fuse:
            self._pending = ActOp(gate_up, out, act)
            return
        T, ff = out.shape
        grid, threads = elem_grid(T * ff)
        if T:
            launch(ops.gated_act_cuda, grid, threads, *gate_up.rows2d(), *out.rows2d(), T, ff, act)

    def layernorm(
        self, x: DeviceTensor, w: DeviceTensor, b: DeviceTensor, eps: float, out: DeviceTensor
    ) -> None:
        self._flush()
        rows, n = x.shape
        if rows:
            launch(layernorm_gelu.layernorm_cuda, rows, ROW_THREADS, *x.rows2d(), w.buf, b.buf, float(eps), n,
                   *out.rows2d())  # fmt: skip

    def gelu(self, x: DeviceTensor) -> None:
        self._flush()
        T, n = x.shape
        grid, threads = elem_grid(T * n)
        if T:
            launch(layernorm_gelu.gelu_cuda, grid, threads, *x.rows2d(), T, n)

    def add(self, x: DeviceTensor, y: DeviceTensor) -> None:
        op = self._pending
        if isinstance(op, ResidualOp) and op.y is None and op.out is not None and same_view(op.x, op.out):
            if same_view(op.out, y):  # y was just normalised in place (a post-norm): fold it in
                self._pending = ResidualOp(x, y, wy=op.w, eps_y=op.eps)
                return
        self._flush()
        if self.fuse:
            self._pending = ResidualOp(x, y)
            return
        T, n = x.shape
        grid, threads = elem_grid(T * n)
        if T:
            launch(ops.add_cuda, grid, threads, *x.rows2d(), *y.rows2d(), T, n, False)

    def moe_combine(self, outs: DeviceTensor, where: np.ndarray, weights: np.ndarray) -> DeviceTensor:
        self._flush()
        T, k = where.shape
        n = outs.shape[1]
        out = self.empty((T, n))
        if T:
            w = self._upload(np.ascontiguousarray(where, np.int32).reshape(-1))
            wt = self._upload(np.ascontiguousarray(weights, np.float32).reshape(-1))
            grid, threads = elem_grid(T * n)
            launch(ops.moe_combine_cuda, grid, threads, *outs.rows2d(), w, wt, k, n, out.buf[: T * n])
        return out

    def add_bias(self, x: DeviceTensor, b: DeviceTensor) -> None:
        self._flush()
        T, n = x.shape
        grid, threads = elem_grid(T * n)
        if T:
            launch(ops.add_cuda, grid, threads, *x.rows2d(), b.buf, b.offset, 0, T, n, True)

    def alloc_kv(
        self, n_layers: int, n_blocks: int, block_size: int, n_kv: int, d: int, dv: int, dtype: str = "f16"
    ) -> DeviceKvCache:
        get_kv_cache_type(dtype).check_head_dims(d, dv)
        return DeviceKvCache(dtype, n_layers, n_blocks, block_size, n_kv, d, dv)

    def write_kv(self, kv: DeviceKvCache, layer: int, k: DeviceTensor, v: DeviceTensor, slots: Any) -> None:
        lay, q8 = kv.layers[layer], kv.kind.q8
        op = self._pending
        if isinstance(op, HeadsOp) and op.completes(k):
            self._pending = None
            op.launch_with_kv(lay, q8, v, slots)
            return
        self._flush()
        T, n_kv, d = k.shape
        dv = v.shape[2]
        grid, threads = elem_grid(T * n_kv * (d + dv))
        if T:
            launch(
                attn.write_kv_cuda,
                grid,
                threads,
                *k.heads3d(),
                *v.heads3d(),
                lay.k,
                lay.v,
                lay.k_scale,
                lay.v_scale,
                q8,
                slots,
                n_kv,
                d,
                dv,
            )

    def read_kv_block(self, kv: DeviceKvCache, block: int) -> bytes:
        self._flush()
        cuda.synchronize()
        return b"".join(c[block].copy_to_host().tobytes() for lay in kv.layers for c in lay.blocks)

    def write_kv_block(self, kv: DeviceKvCache, block: int, payload: bytes) -> None:
        self._flush()
        at = 0
        for lay in kv.layers:
            for c in lay.blocks:
                shape, dtype = c.shape[1:], np.dtype(c.dtype)
                n = int(np.prod(shape)) * dtype.itemsize
                c[block].copy_to_device(np.frombuffer(payload, dtype, n // dtype.itemsize, at).reshape(shape))
                at += n
        if at != len(payload):
            raise ValueError(f"a KV block is {at} bytes here, the payload {len(payload)}")

    def copy_blocks(self, kv: DeviceKvCache, pairs: list[tuple[int, int]]) -> None:
        self._flush()
        if not pairs:
            return
        src = self._upload(np.asarray([p[0] for p in pairs], np.int64))
        dst = self._upload(np.asarray([p[1] for p in pairs], np.int64))
        for lay in kv.layers:
            for cache in lay.blocks:
                per_block = int(np.prod(cache.shape[1:]))
                flat = cache.reshape(cache.shape[0], per_block)
                grid, threads = elem_grid(len(pairs) * per_block)
                launch(attn.copy_blocks_cuda, grid, threads, flat, src, dst, per_block)

    def attention(
        self,
        q: DeviceTensor,
        kv: DeviceKvCache,
        layer: int,
        block_tables: Any,
        seq_index: Any,
        positions: Any,
        window: int,
        scale: float,
        out: DeviceTensor,
        softcap: float = 0.0,
        sinks: Any = None,
    ) -> None:
        if sinks is not None and sinks.shape != (q.shape[1],):  # the kernel reads sinks[h] unchecked
            raise ValueError(f"attention sinks of shape {sinks.shape} for {q.shape[1]} heads")
        self._flush()
        lay, split = kv.layers[layer], self.split_keys
        op = AttnOp(
            q, lay, kv.kind.q8, block_tables, seq_index, positions, window, scale, out, split, softcap, sinks
        )
        if self.fuse:
            self._pending = op  # the output projection's quantization joins it
        else:
            op.launch(self.scratch)
