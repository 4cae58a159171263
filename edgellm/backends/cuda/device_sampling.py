"""The CUDA backend's logits-side methods: the logits-row gather, soft-capping, and sampling on the device
(argmax / top-k, so only ids cross the bus), with the argmax of a whole decode step replayable from a CUDA
graph (graphs.py). A mixin of CudaBackend (backend.py), whose state it uses: scratch, pool, the step
uploader, _flush, _upload, _download."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgellm.backends.cuda import graphs, ops
from edgellm.backends.cuda import sampling as samp
from edgellm.backends.cuda.config import (
    ARGMAX_MAX_BLOCKS,
    ARGMAX_PER_THREAD,
    MAX_TOP_K,
    ROW_THREADS,
    SIMULATOR,
    cdiv,
    elem_grid,
    launch,
    stream,
)
from edgellm.backends.cuda.devarray import DeviceTensor
from edgellm.backends.cuda.step_inputs import StepIndex


class DeviceSampling:
    def take_rows(self, x: DeviceTensor, index: np.ndarray | StepIndex) -> DeviceTensor:
        self._flush()
        rows = index.host if isinstance(index, StepIndex) else np.ascontiguousarray(index, dtype=np.int32)
        if rows.size and (rows.min() < 0 or rows.max() >= x.shape[0]):
            raise IndexError(f"logit rows out of range [0, {x.shape[0]})")
        n = x.shape[1]
        out = self.empty((len(rows), n))
        if out.size:
            dev = index.dev if isinstance(index, StepIndex) else self._upload(rows)
            grid, threads = elem_grid(out.size)
            launch(ops.take_rows_cuda, grid, threads, *x.rows2d(), dev, n, out.buf)
        return out

    def softcap(self, x: DeviceTensor, cap: float) -> DeviceTensor:
        self._flush()
        rows, n = x.shape
        if rows:
            grid, threads = elem_grid(rows * n)
            launch(samp.softcap_cuda, grid, threads, *x.rows2d(), rows, n, np.float32(cap))
        return x

    def _top_k(self, logits: DeviceTensor, k: int, nan_first: bool) -> tuple[Any, Any]:
        self._flush()
        rows, n = logits.shape
        if not 1 <= k <= min(n, MAX_TOP_K):
            raise ValueError(f"top-k on the device needs 1 <= k <= min(n_vocab, {MAX_TOP_K}), got k={k}")
        vals = self.scratch.get("top_v", (max(rows, 1), k), np.float32)
        ids = self.scratch.get("top_i", (max(rows, 1), k), np.int32)
        if rows:
            launch(samp.top_k_rows_cuda, rows, ROW_THREADS, *logits.rows2d(), n, k, nan_first, vals, ids)
        return vals, ids

    def argmax(self, logits: DeviceTensor) -> np.ndarray:
        """np.argmax of each row, computed on the device by many blocks per row in one launch: only the int32
        ids come back."""
        return self._download(self._argmax_launch(logits))

    def argmax_graph(self, batch: Any, forward: Any) -> np.ndarray:
        """argmax(forward(batch)) replayed from a CUDA graph captured for this step's shape (graphs.py; a
        GPU only). forward(batch) must be the model's forward pass: it calls step_inputs(batch) first."""
        if SIMULATOR:
            raise RuntimeError("CUDA graphs need a GPU: the Numba CUDA simulator has none")
        self._flush()
        inputs = self._steps.upload(batch)  # outside the graph: the graph reads the buffer it fills
        key = (len(batch.token_ids), batch.block_tables.shape, len(batch.logits_index), id(self._steps.dev))
        captured = self._graphs.get(key)
        if captured is None:
            self._fixed_inputs = inputs
            try:
                ids = self._download(self._argmax_launch(forward(batch)))  # compiles, sizes the scratch
                step = lambda: self._argmax_launch(forward(batch))  # noqa: E731
                self._graphs[key] = graphs.capture(stream(), self.pool, step)
            finally:
                self._fixed_inputs = None
            return ids
        captured.launch(stream())
        return self._download(captured.out)

    def _argmax_launch(self, logits: DeviceTensor) -> Any:
        """Launch the argmax of each row; returns the device array of ids."""
        self._flush()
        rows, n = logits.shape
        if rows == 0 or n == 0:
            raise ValueError(f"argmax needs a non-empty [rows, n_vocab] array, got {logits.shape}")
        per_block = ROW_THREADS * ARGMAX_PER_THREAD
        nb = min(cdiv(n, per_block), ARGMAX_MAX_BLOCKS)
        chunk = cdiv(n, nb)
        nb = cdiv(n, chunk)  # every block gets a non-empty chunk
        part_v = self.scratch.get("argmax_v", (rows, nb), np.float32)
        part_i = self.scratch.get("argmax_i", (rows, nb), np.int32)
        done = self.scratch.get("argmax_done", (rows,), np.int32)
        if not self._argmax_zeroed.get(rows):
            done.copy_to_device(np.zeros(rows, np.int32))  # once: each launch's last blocks reset it
            self._argmax_zeroed[rows] = True
        ids = self.scratch.get("argmax_ids", (rows,), np.int32)
        launch(samp.argmax_blocks_cuda, (nb, rows), ROW_THREADS, *logits.rows2d(), n, chunk, part_v, part_i,
               done, ids)  # fmt: skip
        return ids

    def top_k(self, logits: DeviceTensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        vals, ids = self._top_k(logits, k, False)
        rows = logits.shape[0]
        return self._download(vals)[:rows], self._download(ids)[:rows]
