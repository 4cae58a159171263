"""The engine core process: the one place that loads the model, steps the engine core and launches kernels.

`serve`, `chat`, `bench` and `LLM` run it in its own process (`run_core_process`, started with the
"spawn" context by core_client.CoreClient), where its loop runs on the process's main thread: GNU OpenMP
kernels ran ~3x slower when launched from another thread or from several threads, and a crash in a
kernel takes down this process only. Tests may build an `EngineCoreProc` in-process to drive its
`engine_core` (engine_core.EngineCore) step by step.

The messages in and out are protocol.py's dataclasses.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from edgellm.engine.config import DEFAULT_CTX, EngineConfig, kv_budget_bytes
from edgellm.engine.engine_core import EngineCore
from edgellm.engine.guidance import GuidedDecoding
from edgellm.engine.model_runner import ModelRunner
from edgellm.engine.protocol import (
    AbortRequests,
    CoreFailed,
    CoreLoadFailed,
    CoreProgress,
    CoreReady,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    RequestKind,
    RequestRejected,
    Shutdown,
    UtilityCall,
    UtilityResult,
)
from edgellm.engine.scheduler import SchedulerConfig
from edgellm.engine.spec.build import build_speculator

IDLE_POLL_S = 0.5  # how often an idle core looks whether its front-end is still there


class EngineCoreProc:
    """Loads the model from `spec.model` (a .gguf path, mmapped) and owns the model, scheduler and
    sampler."""

    def __init__(self, spec: EngineConfig, log: Callable[[str], None] | None = None) -> None:
        from edgellm.engine.runtime import CompileWatch

        # from here on, whatever Numba compiles says so at once (importing the kernels may compile some)
        with CompileWatch(log) as watch:
            self._load(spec, log, watch)

    def _load(self, spec: EngineConfig, log: Callable[[str], None] | None, watch) -> None:  # noqa: ANN001
        from edgellm.arch import ARCHITECTURES
        from edgellm.arch.common import weight_bytes_per_token
        from edgellm.arch.moe import prepare_experts
        from edgellm.backends import get_backend
        from edgellm.backends.cpu.weight_memory import use_huge_pages
        from edgellm.engine.runtime import keep_freed_memory, set_threads, warm_up
        from edgellm.gguf.config import config_from_gguf
        from edgellm.gguf.load import load_gguf
        from edgellm.tokenizer import Tokenizer

        self.stream_interval = spec.stream_interval
        keep_freed_memory()
        self.threads = set_threads(spec.threads)
        t0 = time.perf_counter()
        self.path = str(spec.model)
        gguf = load_gguf(self.path)
        self.config = cfg = config_from_gguf(gguf)
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        eog_ids = frozenset(tokenizer.eog_ids)
        self.backend = get_backend(spec.backend)
        self.backend.huge_pages = use_huge_pages(spec.huge_pages, os.path.getsize(self.path))
        layer_progress = None
        if log:
            name = os.path.basename(self.path)
            pages = "huge pages" if self.backend.huge_pages else "4 KiB pages"
            log(f"loading {name}: {cfg.arch}, {cfg.n_layers} layers, vocab {cfg.n_vocab}; weights on {pages}")

            def layer_progress(done: int, total: int) -> None:
                if done == total or done % max(1, total // 4) == 0:
                    log(f"repacked weights of {done}/{total} layers")

        self.n_ctx = min(spec.n_ctx or DEFAULT_CTX, cfg.n_ctx_train)
        cfg.set_context(self.n_ctx)  # before the model: its rope may depend on the context (LongRoPE)
        self.model = ARCHITECTURES[cfg.arch](cfg, gguf, self.backend, layer_progress)
        if not spec.lazy_experts:
            t1 = time.perf_counter()
            n_experts = prepare_experts(self.model)
            if log and n_experts:
                log(f"prepared the weights of {n_experts} experts in {time.perf_counter() - t1:.1f} s")
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
        if not cfg.causal:
            sched = encoder_scheduling(sched, self.n_ctx)
        speculator = build_speculator(spec.speculative_config(), self, log)
        self.prompt_cache = None
        if spec.prompt_cache is not None:
            from edgellm.engine.prompt_cache import PromptCache, identity

            kv_shape = {"arch": cfg.arch, "layers": cfg.n_kv_layers, "kv_heads": cfg.n_kv_heads,
                        "head_dim": cfg.head_dim, "head_dim_v": cfg.head_dim_v, "dtype": spec.kv_cache_dtype,
                        "block_size": bs, "backend": spec.backend, "adapters": []}  # fmt: skip
            self.prompt_cache = PromptCache(
                spec.prompt_cache, kv_budget_bytes(spec.prompt_cache_size), identity(self.path, kv_shape)
            )
        self.engine_core = EngineCore(
            self.runner,
            eog_ids,
            self.n_ctx,
            sched,
            speculator,
            guidance=GuidedDecoding(tokenizer, cfg.n_vocab),
            prompt_cache=self.prompt_cache,
        )
        self._gguf = gguf  # its tensor table binds adapters loaded later (load_lora)
        self.lora_paths = self._load_lora(spec, gguf, cfg, log)
        load_time = time.perf_counter() - t0
        if log:
            log(
                f"KV cache ({spec.kv_cache_dtype}): {num_blocks} blocks x {bs} tokens = {num_blocks * bs} "
                f"tokens, {num_blocks * per_block / 2**20:.0f} MiB; context {self.n_ctx}; "
                f"{self.threads} threads"
            )
        compile_time = warm_up(self.runner, log, watch)
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
            "huge_pages": self.backend.huge_pages,
            "compile_time": compile_time,
            "weight_bytes_per_token": weight_bytes_per_token(self.model),
            "weight_bytes_total": weight_bytes_per_token(self.model, all_experts=True),
            "pid": os.getpid(),
            "stats": self.stats(),
            "lora": self.lora_adapters(),
        }

    def _load_lora(self, spec: EngineConfig, gguf, cfg, log) -> list[str]:  # noqa: ANN001
        """Load and bind spec.lora's adapters (refused at start when they do not fit the base)."""
        if not spec.lora:
            return []
        from edgellm.lora.adapter import load_adapter

        adapters = [load_adapter(path, gguf, cfg, self.model) for path, _ in spec.lora]
        self.engine_core.set_lora_adapters(adapters, [scale for _, scale in spec.lora])
        if log:
            for k, ((path, scale), a) in enumerate(zip(spec.lora, adapters, strict=True)):
                name, ranks = os.path.basename(path), a.ranks
                log(f"LoRA {k}: {name}, {a.n_tensors} tensors, rank {ranks}, global scale {scale}")
        return [path for path, _ in spec.lora]

    def lora_adapters(self) -> list[dict]:
        """GET /lora-adapters: [{id, path, scale}], the global scales."""
        scales = self.engine_core.lora_scales
        return [{"id": k, "path": p, "scale": scales[k]} for k, p in enumerate(self.lora_paths)]

    def load_lora(self, path: str, scale: float = 1.0) -> list[dict]:
        """Load one more adapter (the next id) at global scale `scale`; the new list. Requests in flight
        keep their adapters (ids only grow)."""
        from edgellm.lora.adapter import load_adapter
        from edgellm.lora.choice import parse_lora_arg

        path, scale = parse_lora_arg(str(path), scale)
        adapter = load_adapter(path, self._gguf, self.config, self.model)
        eng = self.engine_core
        eng.set_lora_adapters([*self.runner.lora_adapters, adapter], [*eng.lora_scales, scale])
        self.lora_paths.append(path)
        return self.lora_adapters()

    def set_lora_scales(self, entries: list | dict) -> list[dict]:
        """POST /lora-adapters: new global scales (an adapter not named is at 0); the new list."""
        from edgellm.lora.choice import request_lora

        self.engine_core.set_lora_scales(request_lora(entries) or {})
        return self.lora_adapters()

    # ---- in-process use ------------------------------------------------------------------------
    def score(self, ids: list[int], lora: dict[int, float] | None = None) -> np.ndarray:
        """Teacher-forced logits: float32 [len(ids), n_vocab], row t predicting token t+1, through the
        engine core as a scoring request (LLM.score sends one). In process, with nothing else in flight:
        the steps it runs would take other requests' outputs with them."""
        eng = self.engine_core
        if eng.has_unfinished():
            raise RuntimeError("EngineCoreProc.score runs the engine alone: other requests are in flight")
        rid = eng.add_score_request(list(ids), lora=lora)
        while eng.has_unfinished():
            for out in eng.step():
                if out.request_id == rid:
                    return out.logits
        raise RuntimeError(f"{rid} ended without its logits")

    def stats(self) -> dict:
        return asdict(self.engine_core.stats())

    # ---- the loop ------------------------------------------------------------------------------
    def handle(self, msg: Any, send: Callable[[Any], None]) -> bool:
        """Apply one message from the front-end; False on shutdown."""
        if isinstance(msg, Shutdown):
            return False
        _HANDLERS[type(msg)](self, msg, send)
        return True

    def _add(self, req: EngineCoreRequest, send: Callable[[Any], None]) -> None:
        core = self.engine_core
        try:
            if req.kind == RequestKind.GENERATE:
                core.add_request(
                    req.prompt_token_ids, req.sampling_params, req.request_id, req.priority, req.group,
                    req.media,
                )  # fmt: skip
            else:
                add = core.add_embedding_request if req.kind == RequestKind.EMBED else core.add_score_request
                add(req.prompt_token_ids, req.request_id, req.priority, req.group)
        except Exception as e:  # a bad request: its sender gets the error, the core goes on
            send(RequestRejected(req.request_id, portable(e)))

    def _abort(self, msg: AbortRequests, send: Callable[[Any], None]) -> None:
        for rid in msg.request_ids:
            self.engine_core.abort(rid, msg.index)

    def _call(self, msg: UtilityCall, send: Callable[[Any], None]) -> None:
        try:
            calls = {
                "stats": self.stats,
                "lora_adapters": self.lora_adapters,
                "set_lora_scales": self.set_lora_scales,
                "load_lora": self.load_lora,
            }
            value = calls[msg.name](*msg.args)
            send(UtilityResult(msg.call_id, True, value))
        except Exception as e:
            send(UtilityResult(msg.call_id, False, portable(e)))

    def run(self, conn: Any) -> None:
        """Serve the front-end over `conn` until it says shutdown or goes away (EOF)."""
        send = conn.send
        eng = self.engine_core
        interval = self.stream_interval
        pending: list[tuple[float, list[EngineCoreOutput]]] = []  # steps not sent yet
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
                pending.append((now, outs))
                if any(map(_first_or_last, outs)) or now - last_sent >= interval or not eng.has_unfinished():
                    send(EngineCoreOutputs(eng.stats(), pending))
                    pending, last_sent = [], now
            elif changed:  # aborts and adds that left the engine idle: the gauges changed
                send(EngineCoreOutputs(eng.stats(), pending))
                pending = []


_HANDLERS: dict[type, Callable[[EngineCoreProc, Any, Callable[[Any], None]], None]] = {
    EngineCoreRequest: EngineCoreProc._add,
    AbortRequests: EngineCoreProc._abort,
    UtilityCall: EngineCoreProc._call,
}


def encoder_scheduling(sched: SchedulerConfig, n_ctx: int) -> SchedulerConfig:
    """An encoder's scheduling: every input whole in one step (a step holds the longest, n_ctx), no
    cap on embedding tokens per step (there are no prompts to yield to), no prefix cache (its KV blocks
    hold nothing: the attention runs on the step's own Q/K/V)."""
    return dataclasses.replace(
        sched,
        max_num_batched_tokens=max(sched.max_num_batched_tokens, n_ctx),
        max_pooled_tokens_per_step=None,
        enable_prefix_caching=False,
        whole_inputs=True,
    )


def _first_or_last(out: EngineCoreOutput) -> bool:
    """A request's first tokens (its TTFT) or its end: sent at once, never batched by stream_interval."""
    return out.first or out.request_finished


def portable(e: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def run_core_process(conn: Any, spec: EngineConfig) -> None:
    """The core process's entry point (its main thread). Ctrl-C in a terminal reaches the whole process
    group: the front-end decides what happens, so the core ignores SIGINT and ends when told, or when its
    front-end's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.core_log is not None:  # e.g. under a full-screen UI, whose screen a traceback would garble
        fd = os.open(spec.core_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    lock = threading.Lock()  # progress comes from the loading thread and the compile heartbeat's

    def log(line: str) -> None:
        with lock:
            conn.send(CoreProgress(line))

    try:
        core = EngineCoreProc(spec, log=log)
    except BaseException as e:  # noqa: BLE001 - reported to the front-end, which raises it
        conn.send(CoreLoadFailed(portable(e)))
        return
    conn.send(CoreReady(core.info))
    try:
        core.run(conn)
    except (EOFError, OSError):
        pass  # the front-end went away
    except BaseException as e:  # a failed step: the front-end fails its requests with this reason
        try:
            conn.send(CoreFailed(portable(e)))
        finally:
            raise
    finally:
        if core.prompt_cache is not None:
            core.prompt_cache.close()  # the blocks still queued go to disk before the process ends
