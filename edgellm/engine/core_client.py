"""The front-end's handle on the engine core process: start it, send it messages, route its per-step
outputs to whoever waits for each request, and fail everything loudly when it dies.

Any number of threads may call `add`/`abort`/`call`. Messages go out through one sender thread and come
in on one receiver thread, so neither side of the pipe can block the other: the receiver never sends.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import queue
import threading
from collections.abc import Callable
from typing import Any

from edgellm.engine.config import EngineConfig
from edgellm.engine.protocol import (
    AbortRequests,
    CoreFailed,
    CoreLoadFailed,
    CoreProgress,
    CoreReady,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineStats,
    RequestRejected,
    Shutdown,
    UtilityCall,
    UtilityResult,
)
from edgellm.spawn import describe_exit, start_without_main

# A sink receives, on the receiver thread, its request's outputs from one core message as a list of
# (EngineCoreOutput, step time) in step order, or one exception (the core rejected the request, or died).
# It must not block.
Sink = Callable[[Any], None]
StepItems = list[tuple[EngineCoreOutput, float]]


class EngineDeadError(RuntimeError):
    """The engine core process is gone (an exception in a step, a signal, or shut down)."""


class CoreLoadError(RuntimeError):
    pass


def _core_main(conn: Any, spec: EngineConfig) -> None:
    """The core process's entry point: the core's modules (model, runner, kernels) load there only."""
    from edgellm.engine.core_process import run_core_process

    run_core_process(conn, spec)


def _describe_exit(code: int | None) -> str:
    return describe_exit("the engine core process", code)


class CoreClient:
    """Starts the core process for `spec` and blocks until it is ready (progress lines go to
    `progress`); raises the core's load error if it cannot load. `on_death(reason)` is called once, on the
    receiver thread, if the core dies while in use."""

    def __init__(
        self,
        spec: EngineConfig,
        progress: Callable[[str], None] | None = None,
        on_death: Callable[[str], None] | None = None,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")  # fork after Numba/OpenMP threads exist is unsafe
        self._conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_core_main, args=(child, spec), name="edgellm-core", daemon=True
        )
        start_without_main(self.process)
        child.close()  # so that the core's death reads as EOF here
        self._on_death = on_death
        self._sinks: dict[str, Sink] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._lock = threading.Lock()
        self._outbox: queue.Queue = queue.Queue()
        # requests still in the outbox, by id: one aborted before the sender takes it is dropped there
        # (the core never adds it), so an abandoned batch costs no steps even while the sender waits
        self._unsent: dict[str, EngineCoreRequest] = {}
        self.error: str | None = None  # why the core is gone
        self._closing = False
        self.info = self._wait_ready(progress)
        self.pid: int = self.info["pid"]
        self._stats = EngineStats(**self.info["stats"])
        self.step_messages = 0  # output messages received (EngineConfig.stream_interval batches steps)
        threading.Thread(target=self._send_loop, name="edgellm-core-send", daemon=True).start()
        threading.Thread(target=self._recv_loop, name="edgellm-core-recv", daemon=True).start()

    def _wait_ready(self, progress: Callable[[str], None] | None) -> dict:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self.process.join(timeout=5)
                self._conn.close()
                raise CoreLoadError(f"{_describe_exit(self.process.exitcode)} while loading") from None
            if isinstance(msg, CoreProgress):
                if progress is not None:
                    progress(msg.line)
            elif isinstance(msg, CoreReady):
                return msg.info
            elif isinstance(msg, CoreLoadFailed):
                self.process.join(timeout=5)
                self._conn.close()
                raise msg.error

    # ---- any thread ----------------------------------------------------------------------------
    def add(self, req: EngineCoreRequest, sink: Sink) -> None:
        """A request for the core (a generation, an embedding or a scoring, checked by the front-end); its
        sink gets the outputs (an embedding's or a scoring's one EngineCoreOutput carries its `embedding`
        or `logits`)."""
        self._register(req, sink)
        self._outbox.put(req)

    def _register(self, req: EngineCoreRequest, sink: Sink) -> None:
        rid = req.request_id
        with self._lock:
            if self.error is not None:
                raise EngineDeadError(self.error)
            if rid in self._sinks:
                raise ValueError(f"request id {rid!r} is already in flight")
            self._sinks[rid] = sink
            self._unsent[rid] = req

    def abort(self, rid: str, index: int | None = None) -> None:
        """Stop a request (or one completion of it); a no-op for one that already finished. Aborting the
        whole request drops its sink at once: nothing more is delivered for it."""
        if index is None:
            self.abort_all([rid])
        elif self.error is None:
            self._outbox.put(AbortRequests([rid], index))

    def abort_all(self, rids: list[str]) -> None:
        """Stop several requests (an abandoned call's inputs) in one message: the core drops them all
        before its next step. Those the sender has not taken yet are dropped here instead: the core never
        sees them, and the message names only the others."""
        with self._lock:
            sent = [rid for rid in rids if self._unsent.pop(rid, None) is None]
            for rid in rids:
                self._sinks.pop(rid, None)
        if sent and self.error is None:
            self._outbox.put(AbortRequests(sent))

    def call(self, name: str, *args: Any) -> Any:
        """A request/reply message to the core ("stats"); blocks the caller only."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self.error is not None:
                raise EngineDeadError(self.error)
            call_id = next(self._call_ids)
            self._calls[call_id] = fut
        self._outbox.put(UtilityCall(call_id, name, args))
        return fut.result()

    def stats(self) -> EngineStats:
        """The engine's gauges as of its last step (pushed with every step, no round trip)."""
        return self._stats

    @property
    def healthy(self) -> bool:
        return self.error is None

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closing = True
        if self.error is None:
            self._outbox.put(Shutdown())
            self._outbox.put(None)
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)

    # ---- sender / receiver threads -------------------------------------------------------------
    def _send_loop(self) -> None:
        while (msg := self._outbox.get()) is not None:
            if isinstance(msg, EngineCoreRequest):
                with self._lock:  # an abort after this point finds it taken, and follows it to the core
                    if self._unsent.get(msg.request_id) is not msg:
                        continue  # aborted while it waited here (or its id reused since)
                    del self._unsent[msg.request_id]
            try:
                self._conn.send(msg)
            except (OSError, ValueError):  # the core is gone: the receiver reports it
                return

    def _recv_loop(self) -> None:
        reason = None
        try:
            while True:
                msg = self._conn.recv()
                if isinstance(msg, EngineCoreOutputs):
                    self._deliver(msg)
                elif isinstance(msg, RequestRejected):
                    with self._lock:
                        sink = self._sinks.pop(msg.request_id, None)
                    if sink is not None:
                        sink(msg.error)
                elif isinstance(msg, UtilityResult):
                    with self._lock:
                        fut = self._calls.pop(msg.call_id)
                    fut.set_result(msg.value) if msg.ok else fut.set_exception(msg.value)
                elif isinstance(msg, CoreFailed):
                    reason = f"the engine core failed: {msg.error!r}"
        except (EOFError, OSError):
            pass
        self.process.join(timeout=2)
        self._die(reason or _describe_exit(self.process.exitcode))

    def _deliver(self, msg: EngineCoreOutputs) -> None:
        self.step_messages += 1
        self._stats = msg.stats
        # a request's outputs from all the steps of one message go to its sink in one call: with
        # stream_interval the front-end then wakes its reader once per message, not per token
        per_request: dict[str, StepItems] = {}
        for t, outs in msg.steps:
            for out in outs:
                per_request.setdefault(out.request_id, []).append((out, t))
        for rid, items in per_request.items():
            with self._lock:
                sink = self._sinks.pop(rid, None) if items[-1][0].request_finished else self._sinks.get(rid)
            if sink is not None:
                sink(items)

    def _die(self, reason: str) -> None:
        if self._closing:
            reason = "the engine was shut down"
        with self._lock:
            self.error = reason
            sinks, self._sinks = list(self._sinks.values()), {}
            calls, self._calls = list(self._calls.values()), {}
        self._outbox.put(None)
        err = EngineDeadError(reason)
        for sink in sinks:
            sink(err)
        for fut in calls:
            fut.set_exception(err)
        if not self._closing and self._on_death is not None:
            self._on_death(reason)
