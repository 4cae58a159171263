"""Launch geometry and the few arithmetic helpers every CUDA kernel shares.

Under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1, used by CI without a GPU) every GPU thread is a
Python thread (~0.7 ms each here), so the simulator uses tiny thread teams; the kernels are written for any
power-of-two team size, so the same code paths (strided loops, shared-memory tree reductions) run in both.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

import numpy as np
from numba import config, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)
if SIMULATOR:
    from edgellm.backends.cuda.simulator_shared import serialize_shared_arrays

    serialize_shared_arrays()

# Threads that cooperate on one output row of a matmul (reduction over weight groups).
MATMUL_LANES = 2 if SIMULATOR else 32
# Output rows per matmul block (one lane team each).
MATMUL_ROWS = 8 if SIMULATOR else 4
# Activation rows each thread of the tiled GEMM reuses a weight group for (register tile in M).
GEMM_TILE_M = 4 if SIMULATOR else 8
# Threads per block for row-wise ops (norms, attention, argmax): one block per row / (token, head).
ROW_THREADS = 4 if SIMULATOR else 128
# Threads per block of the elementwise kernels.
ELEM_THREADS = 4 if SIMULATOR else 256
# Multi-block argmax: logits each thread scans before the row takes another block, and at most this many
# blocks per row (49k logits: 24 blocks, 262k: 128; the simulator: a few blocks of 4 threads).
ARGMAX_PER_THREAD = 4 if SIMULATOR else 16
ARGMAX_MAX_BLOCKS = 256
# Split-K attention: a token with more keys than this spreads them over several blocks (batch-1 decode at
# long contexts would otherwise run one block per head), at most MAX_ATTN_SPLITS; the simulator splits
# early so that tests over a few hundred keys take that path.
ATTN_SPLIT_KEYS = 32 if SIMULATOR else 256
MAX_ATTN_SPLITS = 32
# Largest k of the device top-k (per-thread sorted lists of this length live in local memory).
MAX_TOP_K = 64
# Largest head dim the attention kernel's per-thread V accumulators cover.
MAX_HEAD_DIM = 512
ACC_PER_THREAD = -(-MAX_HEAD_DIM // ROW_THREADS)

F32 = np.float32
F16 = np.float16
RINT_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23: (v + M) - M rounds |v| < 2^22 to an integer, ties to even

if SIMULATOR:

    def mul_rn(a, b):  # noqa: ANN001, ANN202 - simulator stand-in for libdevice's fmul_rn
        return a * b

else:  # pragma: no cover - needs a GPU
    from numba.cuda.libdevice import fmul_rn as mul_rn  # noqa: F401 - a product NVVM never fuses into an FMA


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Elementwise kernels loop grid-stride; the simulator gets one small block (threads are its cost).
MAX_ELEM_BLOCKS = 1 if SIMULATOR else 4096


def elem_grid(n: int) -> tuple[int, int]:
    return max(1, min(MAX_ELEM_BLOCKS, cdiv(n, ELEM_THREADS))), ELEM_THREADS


@cuda.jit(device=True, inline=True)
def f16_round(x):  # noqa: ANN001, ANN201
    """x rounded to float16 (ties to even, overflow to inf) and back to float32: llama.cpp keeps the KV
    cache, attention Q and softmax weights in f16. A float16 store is a cvt.rn, as numpy's cast."""
    t = cuda.local.array(1, np.float16)
    t[0] = x
    return np.float32(t[0])


@cuda.jit(device=True, inline=True)
def rint_f32(v):  # noqa: ANN001, ANN201
    """Round-half-even of a float32 |v| < 2^22 in float32 adds only (nothing NVVM could fuse)."""
    return (v + RINT_MAGIC) - RINT_MAGIC


class KernelStats:
    """What crossed the bus and what was launched: the measure of launch overhead and of device sampling.

    Launch counts are always kept (a dict increment next to a launch that costs microseconds). Profiling
    modes (scripts/profile/cuda_profile.py), off by default: timing = "sync" brackets each launch with device
    synchronizes and adds its wall time (launch cost + GPU time) per kernel to `seconds`; timing = "events"
    records CUDA events around each launch, and collect_events() adds the GPU time per kernel to
    `gpu_seconds`."""

    def __init__(self) -> None:
        self.timing: str | None = None
        self.reset()

    def reset(self) -> None:
        self.launches: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.gpu_seconds: defaultdict[str, float] = defaultdict(float)
        self.events: list[tuple[str, Any, Any]] = []
        self.to_host_bytes = self.to_host_copies = 0
        self.from_host_bytes = self.from_host_copies = 0

    def count_to_host(self, nbytes: int) -> None:
        self.to_host_bytes += int(nbytes)
        self.to_host_copies += 1

    def count_from_host(self, nbytes: int) -> None:
        self.from_host_bytes += int(nbytes)
        self.from_host_copies += 1

    def collect_events(self) -> None:
        """Wait for the recorded launches and add their GPU times (the simulator reports none)."""
        if self.events:
            self.events[-1][2].synchronize()
        for name, e0, e1 in self.events:
            self.gpu_seconds[name] += max(e0.elapsed_time(e1), 0.0) / 1e3
        self.events.clear()

    @property
    def total_launches(self) -> int:
        return sum(self.launches.values())


STATS = KernelStats()
_STREAM: list[Any] = []
CAPTURE_REFS: list[list] = []  # while a CUDA graph is captured: the arguments of its launches (graphs.py)


def stream() -> Any:
    """The backend's one non-default stream: every launch and per-step copy is queued on it, in order. (A
    blocking stream: allocations and weight uploads on the legacy default stream still order with it.)"""
    if not _STREAM:
        _STREAM.append(cuda.stream())
    return _STREAM[0]


def launch(kernel: Any, grid: Any, block: Any, *args: Any) -> None:
    """kernel[grid, block, stream()](*args), counted (and timed in a profiling mode: see KernelStats)."""
    name = kernel.py_func.__name__
    STATS.launches[name] += 1
    if CAPTURE_REFS:
        CAPTURE_REFS[-1].append(args)  # the graph replays with these arrays: they must outlive it
    s = stream()
    if STATS.timing is None:
        kernel[grid, block, s](*args)
    elif STATS.timing == "events":
        e0, e1 = cuda.event(), cuda.event()
        e0.record(s)
        kernel[grid, block, s](*args)
        e1.record(s)
        STATS.events.append((name, e0, e1))
    else:
        s.synchronize()
        t0 = time.perf_counter()
        kernel[grid, block, s](*args)
        s.synchronize()
        STATS.seconds[name] += time.perf_counter() - t0
