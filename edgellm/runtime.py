"""Process-level runtime settings: thread count and the one-time kernel warm-up (Numba compile)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numba

from edgellm.cpu_topology import physical_cores


def set_threads(threads: int | None = None) -> int:
    """--threads, else EDGELLM_THREADS, else the physical cores (capped by what Numba was started with)."""
    n = threads or _env_threads() or physical_cores()
    n = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def _env_threads() -> int:
    raw = os.environ.get("EDGELLM_THREADS", "") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"EDGELLM_THREADS must be a whole number of threads, got {raw!r}") from None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_MAX = 32 * 2**20  # the most glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of handing it back to the kernel. A step's
    activation buffers (megabytes each) are freed and allocated again every step; by default glibc
    serves them with fresh mmaps or trims the heap, and every page is then faulted in and zeroed
    again: ~125,000 page faults in a 16 x 32-token prefill step of SmolLM2 (300 ms, 170 ms without).
    The resident set stays at its peak instead of shrinking between steps. False where it cannot."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def kernels_cached() -> bool:
    """Whether Numba's on-disk cache already holds the attention kernel (a proxy for all of them)."""
    from edgellm.backends.cpu import ops

    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    # Numba uses NUMBA_CACHE_DIR exclusively when it is set, else __pycache__ beside the source.
    root = Path(cache_dir) if cache_dir else Path(ops.__file__).parent / "__pycache__"
    return root.exists() and any(root.rglob("attention.attention_paged_cpu*.nbi"))


def warm_up(runner, log: Callable[[str], None] | None) -> float:
    """Run the model once on a 2-token and a 1-token batch so every kernel is compiled (or loaded from
    Numba's disk cache) before the first request. Returns the seconds it took."""
    from edgellm.engine.model_runner import RunItem

    cold = not kernels_cached()
    t0 = time.perf_counter()
    stop = threading.Event()
    if log and cold:
        log("compiling Numba kernels (first start only; cached on disk afterwards)...")

        def tick() -> None:
            while not stop.wait(5.0):
                log(f"  still compiling... {time.perf_counter() - t0:.0f} s")

        threading.Thread(target=tick, daemon=True).start()
    try:
        # Block 0 is free at start-up; whatever is written there is overwritten before anyone reads it.
        phases = [("prefill kernels", [0, 1]), ("decode kernels", [1])]
        for i, (name, toks) in enumerate(phases, 1):
            start = 0 if len(toks) == 2 else 2
            runner.run([RunItem([0], toks, start)])
            if log and cold:
                log(f"  [{i}/{len(phases)}] {name} compiled ({time.perf_counter() - t0:.1f} s)")
    finally:
        stop.set()
    dt = time.perf_counter() - t0
    if log:
        log(f"kernels {'compiled' if cold else 'loaded from cache'} in {dt:.1f} s")
    return dt
