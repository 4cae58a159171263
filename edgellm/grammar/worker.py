"""Grammar compilation in worker processes: llguidance's native compiler never runs in a process that
serves HTTP or owns the engine, so a schema that crashes it (a stack overflow is a SIGSEGV, not an
exception), loops in it or eats memory costs one worker and fails that one request with a GrammarError.

A small pool of spawned workers, started on first use and reused. Each compile has a worker to itself
(a crash cannot take another request's compile with it) and a deadline: past it the worker is killed. A
dead worker is replaced by the next request that needs one. Each worker caps its address space
(RLIMIT_AS) and compiles on a thread with a stack half the size of the main-thread stack the engine core
builds its matchers on, so what compiles here has room to spare there.

Given the model's tokenizer, a worker also builds the very matcher the engine core will build (same
llguidance tokenizer, same vocabulary size) and computes its first mask the way the core does: a grammar
the core receives is one that is known to build, and one that can match nothing (a `$ref` loop) is refused
here instead of ending its request with empty text.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edgellm.grammar.limits import GrammarError
from edgellm.grammar.native import build_matcher, compile_source
from edgellm.spawn import describe_exit, start_without_main

POOL_SIZE = 2  # compiles at once; a schema compiles in milliseconds, so two serve a server's requests
COMPILE_TIMEOUT_S = 30.0  # one compile, waiting for a worker included
WORKER_MEMORY_BYTES = 4 << 30  # address space of one worker
WORKER_STACK_BYTES = 4 << 20  # the compile thread's stack; the engine core's main thread has 8 MiB

# A job is (kind, source): ("json_schema", dict) | ("grammar", str) | ("regex", str) | ("compiled", str),
# the last an llguidance grammar string to check against a vocabulary. A vocabulary is (tokenizer, n_vocab).
Job = tuple[str, Any]
Vocabulary = tuple[Any, int]

_vocab_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {n_vocab: key}
_vocab_serial = itertools.count(1)
_vocab_lock = threading.Lock()


def vocab_key(vocab: Vocabulary) -> int:
    """A number naming (tokenizer object, n_vocab) for this process's lifetime."""
    tok, n_vocab = vocab
    with _vocab_lock:
        keys = _vocab_keys.setdefault(tok, {})
        if n_vocab not in keys:
            keys[n_vocab] = next(_vocab_serial)
        return keys[n_vocab]


class _Worker:
    def __init__(self, memory_bytes: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # fork after Numba/OpenMP threads exist is unsafe
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=worker_main,
            args=(child, memory_bytes, WORKER_STACK_BYTES),
            name="edgellm-grammar",
            daemon=True,
        )
        start_without_main(self.process)
        child.close()  # so that the worker's death reads as EOF here
        self.vocabs: set[int] = set()  # vocabulary keys this worker has built

    def call(self, message: tuple, timeout: float) -> tuple[str, Any]:
        """Send one message and wait for its reply; raises _Lost when the worker died or ran past
        `timeout` (it is killed then)."""
        try:
            self.conn.send(message)
            if self.conn.poll(max(timeout, 0.0)):
                return self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise _Lost(describe_exit("the grammar compile worker", self.process.exitcode)) from None
        self.kill()
        raise _Lost(None)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=2)
        self.conn.close()


class _Lost(Exception):
    """The worker is gone: its exit, described (None: it ran past its deadline)."""


class GrammarPool:
    def __init__(
        self,
        size: int = POOL_SIZE,
        timeout_s: float = COMPILE_TIMEOUT_S,
        memory_bytes: int = WORKER_MEMORY_BYTES,
    ) -> None:
        self.size, self.timeout_s, self.memory_bytes = size, timeout_s, memory_bytes
        self._idle: list[_Worker] = []
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="edgellm-grammar-wait")
        self._pickled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> bytes
        self.crashes = 0  # workers lost to a signal or a deadline

    def run(self, job: Job, vocab: Vocabulary | None = None, deadline: float | None = None) -> str:
        """The llguidance grammar for `job` (checked against `vocab` when given); GrammarError when it does
        not compile, the worker crashed on it or it ran past the deadline."""
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        if not self._slots.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise GrammarError(f"no grammar compile worker was free within {self.timeout_s:g} s (busy)")
        try:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _Worker(self.memory_bytes)
            key = payload = None
            if vocab is not None:
                key = vocab_key(vocab)
                if key not in worker.vocabs:
                    payload = (self._pickle(vocab[0]), vocab[1])
            try:
                status, value = worker.call(("compile", job, key, payload), deadline - time.monotonic())
            except _Lost as lost:
                self.crashes += 1
                raise GrammarError(_lost_message(job[0], lost.args[0], self.timeout_s)) from None
            if key is not None:
                worker.vocabs.add(key)
            with self._lock:
                self._idle.append(worker)
        finally:
            self._slots.release()
        if status != "ok":
            raise GrammarError(value)
        return value

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` awaited on the pool's own threads (the limit checks, then `run`): a flood of
        compiles cannot take the event loop or its default executor."""
        return await asyncio.wrap_future(self._threads.submit(fn, *args))

    def _pickle(self, tokenizer: Any) -> bytes:
        with self._lock:
            data = self._pickled.get(tokenizer)
        if data is None:
            data = pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
            with self._lock:
                self._pickled[tokenizer] = data
        return data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


def _lost_message(kind: str, exit_text: str | None, timeout_s: float) -> str:
    what = {"json_schema": "JSON schema", "compiled": "grammar"}.get(kind, kind)
    if exit_text is None:
        return f"compiling the {what} took longer than {timeout_s:g} s (COMPILE_TIMEOUT_S) and was stopped"
    return (
        f"compiling the {what} crashed the grammar compiler ({exit_text}; a grammar nested or chained "
        "too deeply can overflow its stack); nothing else was affected"
    )


_pool: GrammarPool | None = None
_pool_lock = threading.Lock()


def default_pool() -> GrammarPool:
    """The process's pool (no process starts until the first compile)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = GrammarPool()
        return _pool


# ---- in the worker ---------------------------------------------------------------------------
def worker_main(conn: Any, memory_bytes: int, stack_bytes: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is expected now and then: no core files
    threading.stack_size(stack_bytes)
    vocabs: dict[int, Vocabulary] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        reply: list[tuple[str, Any]] = []
        thread = threading.Thread(target=_handle, args=(message, vocabs, reply), name="compile")
        thread.start()
        thread.join()
        conn.send(reply[0] if reply else ("error", "the grammar compiler failed without an error message"))


def _handle(message: tuple, vocabs: dict[int, Vocabulary], reply: list[tuple[str, Any]]) -> None:
    reply.append(_compile(message, vocabs))


def _compile(message: tuple, vocabs: dict[int, Vocabulary]) -> tuple[str, Any]:
    _, (kind, source), key, payload = message
    try:
        if payload is not None:
            vocabs[key] = (pickle.loads(payload[0]), payload[1])
        text = source if kind == "compiled" else compile_source(kind, source)
        if key is not None:
            build_matcher(text, *vocabs[key], check_first_mask=True)
        return "ok", text
    except GrammarError as e:
        return "error", str(e)
    except MemoryError:
        return "error", "compiling the grammar ran out of memory (WORKER_MEMORY_BYTES)"
    except Exception as e:  # whatever llguidance raises for an input it cannot take
        return "error", f"the grammar does not compile: {type(e).__name__}: {e}"
