"""A forward step's index arrays in one host->device copy.

Token ids, positions, sequence rows, block tables, KV slots and the logits rows are int32 runs of one pinned
host buffer, sent by one async copy on the backend's stream into a device buffer that lives as long as the
backend; the kernels get views of it. Both buffers grow (doubling) when a step needs more. The host refills
the pinned buffer only after the previous copy has finished (an event), and the stream orders the copy
after the kernels that read the previous step's views.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from edgellm.backends.base import StepIndex, StepInputs
from edgellm.backends.cuda.config import STATS, stream

INT32_MAX = np.iinfo(np.int32).max


class StepUploader:
    def __init__(self) -> None:
        self.capacity = 0
        self.pinned: Any = None
        self.dev: Any = None
        self.copied: Any = None  # event recorded after the last copy

    def _reserve(self, n: int) -> None:
        if n <= self.capacity:
            if self.copied is not None:
                self.copied.synchronize()  # the pinned buffer is still being read by the last copy
            return
        cuda.synchronize()  # the old device buffer may still be read by queued kernels
        self.capacity = max(n, 2 * self.capacity, 1024)
        self.pinned = cuda.pinned_array(self.capacity, np.int32)
        self.dev = cuda.device_array(self.capacity, np.int32)

    def upload(self, batch: Any) -> StepInputs:
        tables = batch.block_tables
        parts = [batch.token_ids, batch.positions, batch.seq_index, tables.reshape(-1), batch.slots,
                 batch.logits_index]  # fmt: skip
        for p in parts:
            if len(p) and (p.min() < 0 or p.max() > INT32_MAX):
                raise ValueError(f"step index values must lie in [0, 2^31): got [{p.min()}, {p.max()}]")
        sizes = [len(p) for p in parts]
        ends = np.cumsum(sizes)
        self._reserve(int(ends[-1]))
        start = 0
        for p, end in zip(parts, ends, strict=True):
            self.pinned[start:end] = p
            start = end
        n = int(ends[-1])
        if n:
            s = stream()
            self.dev[:n].copy_to_device(self.pinned[:n], stream=s)
            self.copied = cuda.event()
            self.copied.record(s)
            STATS.count_from_host(4 * n)
        views = [self.dev[int(e - k) : int(e)] for e, k in zip(ends, sizes, strict=True)]
        return StepInputs(
            StepIndex(np.asarray(batch.token_ids), views[0]),
            views[1],
            views[2],
            views[3].reshape(tables.shape) if tables.size else cuda.device_array(tables.shape, np.int32),
            views[4],
            StepIndex(np.asarray(batch.logits_index), views[5]),
        )
