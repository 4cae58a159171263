"""Process-level runtime settings: thread count and the one-time kernel warm-up (Numba compile)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

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


HEARTBEAT_S = 5.0  # how often a compile going on says so


class CompileWatch:
    """Says "compiling Numba kernels" the moment Numba starts compiling anything, and then every
    HEARTBEAT_S seconds while it goes on, naming the kernel being compiled.

    It listens to Numba's "numba:compile" event, which fires only when a function's machine code is not
    in the disk cache (a first start, a new Numba, edited sources, another CPU): loading a cached kernel is
    silent, so a warm start prints nothing. Active between `start()` and `stop()` (a context manager too)
    in the engine-core process, around everything that may compile (the model's load, where weights are
    repacked by Numba kernels, and the warm-up). `log` may be called from the heartbeat thread."""

    def __init__(self, log: Callable[[str], None] | None, heartbeat_s: float = HEARTBEAT_S) -> None:
        from numba.core import event

        self._event = event
        self._log = log
        self._heartbeat_s = heartbeat_s
        self._depth = 0
        self._current = ""
        self.compiled = 0  # functions compiled (cache misses), nested ones included
        self.seconds = 0.0  # wall time with a compile going on
        self._t0 = self._since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        watch = self

        class _Listener(event.Listener):
            def on_start(self, ev) -> None:  # noqa: ANN001 - numba.core.event.Event
                watch._started(ev.data)

            def on_end(self, ev) -> None:  # noqa: ANN001
                watch._ended()

        self._listener = _Listener()

    @property
    def cold(self) -> bool:
        """Whether anything was compiled (rather than loaded from Numba's disk cache)."""
        return self.compiled > 0

    def _started(self, data: dict) -> None:
        self.compiled += 1
        self._depth += 1
        if self._depth == 1:  # the kernel asked for, not the helpers and Numba overloads it compiles
            fn = getattr(data.get("dispatcher"), "py_func", None)
            self._current = getattr(fn, "__qualname__", "")
            self._since = time.perf_counter()
        if self.compiled == 1:
            self._t0 = self._since
            if self._log:
                self._log("compiling Numba kernels (first start only; cached on disk afterwards)...")
                self._thread = threading.Thread(target=self._tick, daemon=True, name="compile-heartbeat")
                self._thread.start()

    def _ended(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._since

    def _tick(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            if self._depth > 0 and self._log:
                what = f" ({self._current})" if self._current else ""
                self._log(f"  still compiling... {time.perf_counter() - self._t0:.0f} s{what}")

    def start(self) -> CompileWatch:
        self._event.register("numba:compile", self._listener)
        return self

    def stop(self) -> None:
        self._event.unregister("numba:compile", self._listener)
        self._stop.set()

    def __enter__(self) -> CompileWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def warm_up(runner, log: Callable[[str], None] | None, watch: CompileWatch | None = None) -> float:
    """Run the model once on a 2-token and a 1-token batch so every kernel is compiled (or loaded from
    Numba's disk cache) before the first request. Returns the seconds it took. `watch`: the process's
    CompileWatch, already started (the compile notice and heartbeat come from it); one of its own
    otherwise."""
    from edgellm.engine.model_runner import RunItem

    own = watch is None
    watch = CompileWatch(log).start() if watch is None else watch
    before = watch.compiled
    t0 = time.perf_counter()
    try:
        # Block 0 is free at start-up; whatever is written there is overwritten before anyone reads it.
        phases = [("prefill kernels", [0, 1], ()), ("decode kernels", [1], ())]
        if not runner.cfg.causal:  # an encoder runs whole inputs only (arch/encoder.py)
            phases = phases[:1]
        # a step with an adapter runs its layers kernel by kernel (arch/llama.py): compile those too
        if getattr(runner, "lora_adapters", None):
            first = ((0, 1.0),)
            phases += [("LoRA prefill kernels", [0, 1], first), ("LoRA decode kernels", [1], first)]
        for i, (name, toks, lora) in enumerate(phases, 1):
            start = 0 if len(toks) == 2 else 2
            runner.run([RunItem([0], toks, start, lora=lora)])
            if log and watch.compiled > before:
                log(f"  [{i}/{len(phases)}] {name} compiled ({time.perf_counter() - t0:.1f} s)")
    finally:
        if own:
            watch.stop()
    dt = time.perf_counter() - t0
    if log:
        log(f"kernels {'compiled' if watch.compiled > before else 'loaded from cache'} in {dt:.1f} s")
    return dt
