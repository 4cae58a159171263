"""CUDA graphs for decode steps: a step's launches captured once per shape and replayed with one
cuGraphLaunch, so the Python cost of ~270 launches per SmolLM2 token is paid once per shape.

Off by default: only CudaBackend.argmax_graph uses it, and nothing in the engine calls that yet (the
ModelRunner would have to hand the backend a whole decode step, forward + argmax, as one callable: an
interface change left to the engine's owners). The Numba CUDA simulator has no graphs, so this runs only on
a GPU: scripts/gpu/gpu_check.py's `graphs` step compares its tokens and timings with plain launches.

What makes a step replayable:
- the key (tokens, block-table shape, logit rows, the step-input device buffer): the same sizes give the
  same offsets into the one step-input buffer and the same launch grids (split-K's grid follows the
  table width); the index arrays are copied up before each launch, outside the graph (step_inputs.py);
- the first step of a key runs plainly (compiles, grows every scratch array to its size); the same step is
  then captured in relaxed mode with the activation pool handing out buffers private to the graph, and
  every array the captured launches received is kept alive as long as the graph;
- deallocations are deferred during the capture (a cuMemFree there would end it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import cuda

from edgellm.backends.cuda import config
from edgellm.backends.cuda.devarray import BufferPool


def _check(result: tuple) -> Any:
    from cuda.bindings import driver as drv

    if result[0] != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA graph call failed: {result[0]!r}")
    return result[1] if len(result) > 1 else None


class CapturedStep:
    """An instantiated graph, the arrays its launches read and write, and its output `out`."""

    def __init__(self, graph: Any, exe: Any, keep: list, out: Any) -> None:
        self.graph, self.exe, self.keep, self.out = graph, exe, keep, out

    def launch(self, stream: Any) -> None:
        from cuda.bindings import driver as drv

        _check(drv.cuGraphLaunch(self.exe, drv.CUstream(int(stream.handle))))

    def __del__(self) -> None:
        try:
            from cuda.bindings import driver as drv

            drv.cuGraphExecDestroy(self.exe)
            drv.cuGraphDestroy(self.graph)
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the driver may be gone first
            pass


def capture(stream: Any, pool: BufferPool, step: Callable[[], Any]) -> CapturedStep:
    """Record what step() launches on `stream` (not run: launch the result) into an instantiated graph;
    step() returns the device array the caller reads after each replay."""
    from cuda.bindings import driver as drv

    if config.SIMULATOR:
        raise RuntimeError("CUDA graphs need a GPU: the Numba CUDA simulator has none")
    h = drv.CUstream(int(stream.handle))
    stream.synchronize()
    keep: list = []
    config.CAPTURE_REFS.append(keep)
    pool.private = []
    try:
        with cuda.defer_cleanup():
            _check(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            try:
                out = step()
            finally:
                graph = _check(drv.cuStreamEndCapture(h))  # ends the capture even when step() failed
        keep.append(pool.private)
    finally:
        pool.private = None
        config.CAPTURE_REFS.remove(keep)
    exe = _check(drv.cuGraphInstantiate(graph, 0))
    return CapturedStep(graph, exe, keep, out)
