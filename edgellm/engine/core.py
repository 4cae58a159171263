"""The engine core: the one place that loads the model, calls `step()` and launches kernels.

`serve`, `chat`, `bench` and `LLM` run it in its own process (`run_core_process`, started with the
"spawn" context by core_client.CoreClient), where its loop runs on the process's main thread: GNU OpenMP
kernels ran ~3x slower when launched from another thread or from several threads, and a crash in a
kernel takes down this process only. Tests may build an `EngineCore` in-process to drive its engine.

Messages in (tuples): ("add", rid, prompt_ids, params, priority, group), ("embed", rid, input_ids, priority,
group) (group: the client request's id, shared by its engine requests, or None),
("abort", rid, index|None), ("abort_all", [rid, ...]), ("call", call_id, name, args), ("shutdown",).
Out: ("progress", line),
("ready", info), ("load_error", exc), per step (or per CoreSpec.stream_interval) ("step", stats,
[(time, outputs), ...]) with outputs as (rid, finished, deltas, cached, preemptions, embedding|None),
("add_error", rid, exc), ("reply", call_id, ok, value). Only ids, numbers, strings, the SamplingParams
dataclass and exceptions cross: no tokenizer state.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgellm.engine.checks import PromptTooLongError
from edgellm.engine.guidance import GuidedDecoding
from edgellm.engine.llm_engine import LLMEngine
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.outputs import RequestOutput
from edgellm.engine.scheduler import SchedulerConfig
from edgellm.engine.sequence import Sequence as EngineSequence
from edgellm.engine.spec.build import build_speculator
from edgellm.engine.spec.config import SpeculativeConfig

DEFAULT_CTX = 4096
DEFAULT_KV_MEMORY = 512 * 2**20  # bytes of KV cache when not given (at least one full context is kept)
IDLE_POLL_S = 0.5  # how often an idle core looks whether its front-end is still there


@dataclass
class CoreSpec:
    """What the core process needs to build the engine (plain values: it crosses to the new process)."""

    path: str
    backend: str = "cpu"
    n_ctx: int | None = None
    threads: int | None = None
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_memory: int | float | None = None
    kv_cache_dtype: str = "f16"  # a row of quants/kv_cache.py's table: "f16" or "q8_0"
    enable_prefix_caching: bool = True
    log_path: str | None = None  # where the core process's stdout/stderr go (None: inherited)
    speculative: SpeculativeConfig | None = None  # speculative decoding (None: off)
    # Seconds between output messages while requests are under way (0: one per step). A request's first
    # and last outputs are never held back; only the tokens in between are sent in batches.
    stream_interval: float = 0.0


def kv_budget_bytes(kv_cache_memory: int | float | None) -> int:
    """KV cache budget: bytes (an int), or a fraction of physical RAM (a float in (0, 1))."""
    if kv_cache_memory is None:
        return DEFAULT_KV_MEMORY
    if isinstance(kv_cache_memory, float) and 0 < kv_cache_memory < 1:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * kv_cache_memory)
    if kv_cache_memory < 0:
        raise ValueError(f"kv_cache_memory must be bytes >= 0 or a fraction in (0, 1), got {kv_cache_memory}")
    return int(kv_cache_memory)


class EngineCore:
    """Loads the model from `spec.path` (mmapped) and owns the model, scheduler and sampler."""

    def __init__(self, spec: CoreSpec, log: Callable[[str], None] | None = None) -> None:
        from edgellm.arch import ARCHITECTURES
        from edgellm.arch.common import weight_bytes_per_token
        from edgellm.backends import get_backend
        from edgellm.gguf.config import config_from_gguf
        from edgellm.gguf.load import load_gguf
        from edgellm.runtime import keep_freed_memory, set_threads, warm_up
        from edgellm.tokenizer import Tokenizer

        self.stream_interval = spec.stream_interval
        keep_freed_memory()
        self.threads = set_threads(spec.threads)
        t0 = time.perf_counter()
        gguf = load_gguf(spec.path)
        self.path = spec.path
        self.config = cfg = config_from_gguf(gguf)
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        eog_ids = frozenset(tokenizer.eog_ids)
        self.backend = get_backend(spec.backend)
        layer_progress = None
        if log:
            name = os.path.basename(spec.path)
            log(f"loading {name}: {cfg.arch}, {cfg.n_layers} layers, vocab {cfg.n_vocab}")

            def layer_progress(done: int, total: int) -> None:
                if done == total or done % max(1, total // 4) == 0:
                    log(f"repacked weights of {done}/{total} layers")

        self.n_ctx = min(spec.n_ctx or DEFAULT_CTX, cfg.n_ctx_train)
        cfg.set_context(self.n_ctx)  # before the model: its rope may depend on the context (LongRoPE)
        self.model = ARCHITECTURES[cfg.arch](cfg, gguf, self.backend, layer_progress)
        bs = spec.block_size
        per_block = ModelRunner.kv_bytes_per_block(cfg, bs, spec.kv_cache_dtype)
        num_blocks = max(kv_budget_bytes(spec.kv_cache_memory) // per_block, -(-self.n_ctx // bs) + 1)
        self.runner = ModelRunner(self.model, cfg, self.backend, num_blocks, bs, spec.kv_cache_dtype)
        sched = SchedulerConfig(
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=max(spec.max_num_batched_tokens, spec.max_num_seqs),
            block_size=bs,
            num_blocks=num_blocks,
            enable_prefix_caching=spec.enable_prefix_caching,
            max_model_len=self.n_ctx,
        )
        speculator = build_speculator(spec.speculative, self, log)
        self.engine = LLMEngine(
            self.runner,
            eog_ids,
            self.n_ctx,
            sched,
            speculator,
            guidance=GuidedDecoding(tokenizer, cfg.n_vocab),
        )
        load_time = time.perf_counter() - t0
        if log:
            log(
                f"KV cache ({spec.kv_cache_dtype}): {num_blocks} blocks x {bs} tokens = {num_blocks * bs} "
                f"tokens, {num_blocks * per_block / 2**20:.0f} MiB; context {self.n_ctx}; "
                f"{self.threads} threads"
            )
        compile_time = warm_up(self.runner, log)
        self.info = {
            "n_ctx": self.n_ctx,
            "n_vocab": cfg.n_vocab,
            "threads": self.threads,
            "num_kv_blocks": num_blocks,
            "block_size": bs,
            "kv_cache_bytes": num_blocks * per_block,
            "kv_cache_dtype": spec.kv_cache_dtype,
            "kv_bytes_per_token": per_block // bs,
            "load_time": load_time,
            "compile_time": compile_time,
            "weight_bytes_per_token": weight_bytes_per_token(self.model),
            "weight_bytes_total": weight_bytes_per_token(self.model, all_experts=True),
            "pid": os.getpid(),
            "stats": self.stats(),
        }

    # ---- requests that are not generation ------------------------------------------------------
    def score(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits: float32 [len(ids), n_vocab], row t predicting token t+1."""
        ids = list(ids)
        if not ids:
            raise ValueError("score() needs at least one token")
        if any(isinstance(t, bool) or not 0 <= t < self.config.n_vocab for t in ids):
            raise ValueError(f"token ids must be in 0..{self.config.n_vocab - 1}")
        if len(ids) > self.n_ctx:
            raise PromptTooLongError(
                len(ids), self.n_ctx, f"{len(ids)} tokens exceed the context window of {self.n_ctx}"
            )
        bm = self.engine.scheduler.block_manager
        seq = EngineSequence(-1, ids)
        if not bm.can_allocate(seq, len(ids)):
            raise RuntimeError("not enough free KV blocks to score this sequence while other requests run")
        bm.allocate(seq, len(ids))
        try:
            chunk = self.engine.scheduler.config.max_num_batched_tokens
            rows = []
            for start in range(0, len(ids), chunk):
                item = RunItem(seq.block_table, ids[start : start + chunk], start, all_logits=True)
                rows.append(self.runner.run([item])[0])
            return np.concatenate(rows, axis=0)
        finally:
            bm.free(seq)

    def stats(self) -> dict:
        return asdict(self.engine.stats())

    # ---- the loop ------------------------------------------------------------------------------
    def handle(self, msg: tuple, send: Callable[[tuple], None]) -> bool:
        """Apply one message from the front-end; False on shutdown."""
        kind = msg[0]
        if kind == "add":
            _, rid, ids, params, priority, group = msg
            try:
                self.engine.add_request(ids, params, rid, priority, group)
            except Exception as e:  # a bad request: its sender gets the error, the core goes on
                send(("add_error", rid, portable(e)))
        elif kind == "embed":
            _, rid, ids, priority, group = msg
            try:
                self.engine.add_embedding_request(ids, rid, priority, group)
            except Exception as e:
                send(("add_error", rid, portable(e)))
        elif kind == "abort":
            self.engine.abort(msg[1], msg[2])
        elif kind == "abort_all":
            for rid in msg[1]:
                self.engine.abort(rid)
        elif kind == "call":
            _, call_id, name, args = msg
            try:
                value = {"score": self.score, "stats": self.stats}[name](*args)
                send(("reply", call_id, True, value))
            except Exception as e:
                send(("reply", call_id, False, portable(e)))
        elif kind == "shutdown":
            return False
        return True

    def run(self, conn: Any) -> None:
        """Serve the front-end over `conn` until it says shutdown or goes away (EOF)."""
        send = conn.send
        eng = self.engine
        interval = self.stream_interval
        pending: list[tuple[float, list]] = []  # (time, outputs) of steps not sent yet
        last_sent = 0.0
        while True:
            busy = eng.has_unfinished()
            changed = False
            if conn.poll(0 if busy else IDLE_POLL_S):
                while True:
                    if not self.handle(conn.recv(), send):
                        return
                    changed = True
                    if not conn.poll(0):
                        break
            if eng.has_unfinished():
                outs = eng.step()
                now = time.perf_counter()
                pending.append((now, [_wire(o) for o in outs]))
                if any(map(_first_or_last, outs)) or now - last_sent >= interval or not eng.has_unfinished():
                    send(("step", self.stats(), pending))
                    pending, last_sent = [], now
            elif changed:  # aborts and adds that left the engine idle: the gauges changed
                send(("step", self.stats(), pending))
                pending = []


def _first_or_last(out: RequestOutput) -> bool:
    """A request's first tokens (its TTFT) or its end: sent at once, never batched by stream_interval. First:
    every token the request has generated is in this output."""
    return out.finished or out.metrics.num_generated_tokens == sum(len(d.token_ids) for d in out.deltas)


def _wire(out: RequestOutput) -> tuple:
    m = out.metrics
    deltas = [(d.index, d.token_ids, d.finish_reason, d.logprobs) for d in out.deltas]
    return (out.request_id, out.finished, deltas, m.num_cached_tokens, m.num_preemptions, out.embedding)


def portable(e: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def run_core_process(conn: Any, spec: CoreSpec) -> None:
    """The core process's entry point (its main thread). Ctrl-C in a terminal reaches the whole process
    group: the front-end decides what happens, so the core ignores SIGINT and ends when told, or when its
    front-end's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.log_path is not None:  # e.g. under a full-screen UI, whose screen a traceback would garble
        fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        core = EngineCore(spec, log=lambda line: conn.send(("progress", line)))
    except BaseException as e:  # noqa: BLE001 - reported to the front-end, which raises it
        conn.send(("load_error", portable(e)))
        return
    conn.send(("ready", core.info))
    try:
        core.run(conn)
    except (EOFError, OSError):
        pass  # the front-end went away
    except BaseException as e:  # a failed step: the front-end fails its requests with this reason
        try:
            conn.send(("fatal", portable(e)))
        finally:
            raise
