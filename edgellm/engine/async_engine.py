"""asyncio streaming front of the engine, for the server and the TUI.

The engine runs on one background thread that owns it completely (the kernels release the GIL, so the
event loop keeps serving while a step runs). Callers talk to it only through small messages: an add or
an abort command in, RequestOutput deltas out on a per-request asyncio queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from edgellm.engine.llm_engine import EngineStats, LLMEngine
from edgellm.engine.outputs import RequestOutput
from edgellm.sampling import SamplingParams


@dataclass
class _Add:
    prompt: str | list[int]
    params: SamplingParams
    request_id: str | None
    priority: int
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Abort:
    request_id: str


class EngineDeadError(RuntimeError):
    pass


async def _drain(q: asyncio.Queue, on_early_exit) -> AsyncIterator[RequestOutput]:
    """Yield a request's outputs from its queue until the finished one; an engine error arrives as an
    exception object. Leaving before the end (disconnect, cancellation) calls on_early_exit (abort)."""
    finished = False
    try:
        while True:
            item = await q.get()
            if isinstance(item, BaseException):
                raise EngineDeadError(f"engine failed: {item!r}") from item
            yield item
            if item.finished:
                finished = True
                return
    finally:
        if not finished:
            on_early_exit()


class AsyncLLMEngine:
    """With own_thread=False the caller runs the engine loop itself with run_forever(), normally on the
    process's main thread: GNU OpenMP kernels launched from another thread ran ~3x slower here (its
    worker threads stop spinning between parallel regions once it manages more threads than cores)."""

    def __init__(self, engine: LLMEngine, own_thread: bool = True) -> None:
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats = engine.stats()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="edgellm-engine", daemon=True)
        if own_thread:
            self._thread.start()
        else:
            self._thread = threading.current_thread()

    def run_forever(self) -> None:
        """Run the engine loop in the calling thread until shutdown() (own_thread=False)."""
        self._loop()

    # ---- caller side (event loop) --------------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Yields the request's deltas until it finishes. Leaving the iteration early (a client that
        disconnected, a cancelled task) aborts the request and frees its KV blocks at once."""
        if self._error is not None:
            raise EngineDeadError(f"engine stopped after an error: {self._error!r}")
        loop = asyncio.get_running_loop()
        cmd = _Add(prompt, params, request_id, priority, loop, asyncio.Queue())
        self._commands.put(cmd)
        try:
            rid = await asyncio.wrap_future(cmd.done)  # raises the engine's ValueError for a bad request
        except asyncio.CancelledError:
            # the client left while the engine was taking the request: abort it once its id is known
            cmd.done.add_done_callback(self._abort_added)
            raise
        async for item in _drain(cmd.out, on_early_exit=lambda: self._commands.put(_Abort(rid))):
            yield item

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def _abort_added(self, done: concurrent.futures.Future) -> None:
        if not done.cancelled() and done.exception() is None:
            self.abort(done.result())

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def healthy(self) -> bool:
        return self._error is None and self._thread.is_alive()

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(None)
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=10)

    # ---- engine thread -------------------------------------------------------------------------
    def _handle(self, cmd: _Add | _Abort | None) -> None:
        if cmd is None:
            return
        if isinstance(cmd, _Abort):
            self.engine.abort(cmd.request_id)
            self._streams.pop(cmd.request_id, None)
            return
        if not cmd.done.set_running_or_notify_cancel():  # the caller was cancelled before we got here
            return
        try:
            rid = self.engine.add_request(cmd.prompt, cmd.params, cmd.request_id, cmd.priority)
        except Exception as e:  # a bad request: the caller gets the error, the engine goes on
            cmd.done.set_exception(e)
            return
        self._streams[rid] = (cmd.loop, cmd.out)
        cmd.done.set_result(rid)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                block = not self.engine.has_unfinished()
                try:
                    self._handle(self._commands.get(block=block, timeout=0.5 if block else None))
                    while True:
                        self._handle(self._commands.get_nowait())
                except queue.Empty:
                    pass
                if self.engine.has_unfinished():
                    for out in self.engine.step():
                        self._deliver(out)
                self._stats = self.engine.stats()
        except BaseException as e:  # keep callers from waiting forever on a dead engine
            self._error = e
            for loop, q in self._streams.values():
                loop.call_soon_threadsafe(q.put_nowait, e)
            raise

    def _deliver(self, out: RequestOutput) -> None:
        target = self._streams.get(out.request_id)
        if target is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        loop, q = target
        try:
            loop.call_soon_threadsafe(q.put_nowait, out)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            self.engine.abort(out.request_id)


class LoopLLMEngine:
    """The same streaming interface as AsyncLLMEngine, but the engine steps run as a task on the calling
    event loop's own thread (for an app whose main thread is its event loop, like the TUI): GNU OpenMP
    kernels launched from a non-main thread ran ~3x slower here. Each step blocks the loop for one
    forward pass (milliseconds at decode; keep prefill chunks small with max_num_batched_tokens)."""

    def __init__(self, engine: LLMEngine, threads: int | None = None) -> None:
        from edgellm.runtime import set_threads

        self.engine = engine
        self.threads = set_threads(threads)  # Numba's thread count is per calling thread
        self._streams: dict[str, asyncio.Queue] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        if self._error is not None:
            raise EngineDeadError(f"engine stopped after an error: {self._error!r}")
        rid = self.engine.add_request(prompt, params, request_id, priority)  # ValueError for a bad request
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = q
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

        def leave_early() -> None:
            self._streams.pop(rid, None)
            self.engine.abort(rid)  # frees its KV blocks at once

        async for item in _drain(q, on_early_exit=leave_early):
            yield item

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._streams.pop(request_id, None)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def healthy(self) -> bool:
        return self._error is None

    def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                if not self.engine.has_unfinished():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                for out in self.engine.step():
                    q = self._streams.get(out.request_id)
                    if q is not None:
                        q.put_nowait(out)
                await asyncio.sleep(0)  # let the app draw and take input between steps
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._error = e
            for q in self._streams.values():
                q.put_nowait(e)
