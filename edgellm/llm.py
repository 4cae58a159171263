"""The Python API: `LLM` loads a model (catalog name or .gguf path) and runs it through the engine."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgellm.arch import ARCHITECTURES
from edgellm.backends.base import get_backend
from edgellm.catalog import DEFAULT_MODEL, resolve_model
from edgellm.engine.llm_engine import LLMEngine, PromptTooLongError
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.outputs import CompletionOutput, RequestMetrics
from edgellm.engine.scheduler import SchedulerConfig
from edgellm.engine.sequence import Sequence as EngineSequence
from edgellm.gguf.config import ModelConfig, config_from_gguf
from edgellm.gguf.reader import load_gguf
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.runtime import set_threads, warm_up
from edgellm.sampling import SamplingParams

DEFAULT_CTX = 4096
DEFAULT_KV_MEMORY = 512 * 2**20  # bytes of KV cache when not given (at least one full context is kept)


@dataclass
class GenerationOutput:
    """One prompt's result. `token_ids`/`text`/`finish_reason` are those of the first completion."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


def kv_budget_bytes(kv_cache_memory: int | float | None) -> int:
    """KV cache budget: bytes (an int), or a fraction of physical RAM (a float in (0, 1))."""
    if kv_cache_memory is None:
        return DEFAULT_KV_MEMORY
    if isinstance(kv_cache_memory, float) and 0 < kv_cache_memory < 1:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * kv_cache_memory)
    if kv_cache_memory < 0:
        raise ValueError(f"kv_cache_memory must be bytes >= 0 or a fraction in (0, 1), got {kv_cache_memory}")
    return int(kv_cache_memory)


class LLM:
    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        backend: str = "cpu",
        n_ctx: int | None = None,
        threads: int | None = None,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        block_size: int = 16,
        kv_cache_memory: int | float | None = None,  # bytes, or a fraction of RAM; default 512 MiB
        enable_prefix_caching: bool = True,
        verbose: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        log = progress or (
            (lambda msg: print(f"edgellm: {msg}", file=sys.stderr, flush=True)) if verbose else None
        )
        self.threads = set_threads(threads)
        self.path: Path = resolve_model(model)
        t0 = time.perf_counter()
        gguf = load_gguf(self.path)
        self.config: ModelConfig = config_from_gguf(gguf)
        validate_model(gguf, self.config)  # before any kernel sees a shape the file claims
        self.metadata = gguf.metadata
        self.tokenizer = tokenizer_from_gguf(gguf)
        self.backend = get_backend(backend)
        cfg = self.config
        layer_progress = None
        if log:
            log(f"loading {self.path.name}: {cfg.arch}, {cfg.n_layers} layers, vocab {cfg.n_vocab}")

            def layer_progress(done: int, total: int) -> None:
                if done == total or done % max(1, total // 4) == 0:
                    log(f"repacked weights of {done}/{total} layers")

        self.model = ARCHITECTURES[cfg.arch](cfg, gguf, self.backend, layer_progress)
        self.n_ctx = min(n_ctx or DEFAULT_CTX, cfg.n_ctx_train)
        per_block = ModelRunner.kv_bytes_per_block(cfg, block_size)
        budget = kv_budget_bytes(kv_cache_memory)
        num_blocks = max(budget // per_block, -(-self.n_ctx // block_size) + 1)
        self.kv_cache_bytes = num_blocks * per_block
        runner = ModelRunner(self.model, cfg, self.backend, num_blocks, block_size)
        sched = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(max_num_batched_tokens, max_num_seqs),
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=self.n_ctx,
        )
        self.engine = LLMEngine(runner, self.tokenizer, self.n_ctx, sched)
        self.load_time = time.perf_counter() - t0
        if log:
            log(
                f"KV cache: {num_blocks} blocks x {block_size} tokens = {num_blocks * block_size} tokens, "
                f"{self.kv_cache_bytes / 2**20:.0f} MiB; context {self.n_ctx}; {self.threads} threads"
            )
        self.compile_time = warm_up(runner, log)

    # ---- text <-> ids --------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | None = None,
        on_output: Callable | None = None,
    ) -> list[GenerationOutput]:
        """Run every prompt through the engine together (continuous batching); results in prompt order.
        A prompt is text (BOS added when the model's metadata says so) or a list of token ids."""
        params = params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        rids = []
        try:
            for p in prompts:
                rids.append(self.engine.add_request(p, params))
        except Exception:
            for rid in rids:
                self.engine.abort(rid)
            raise
        results: dict[str, GenerationOutput] = {}
        texts: dict[str, dict[int, CompletionOutput]] = {
            rid: {i: CompletionOutput(i, [], "", None) for i in range(params.n)} for rid in rids
        }
        prompt_ids = {rid: self.engine.requests[rid].prompt_ids for rid in rids}
        while len(results) < len(rids):
            for out in self.engine.step():
                if out.request_id not in texts:
                    continue  # a request someone else added to this engine directly
                for d in out.deltas:
                    c = texts[out.request_id][d.index]
                    c.token_ids.extend(d.token_ids)
                    c.text += d.text
                    c.finish_reason = d.finish_reason or c.finish_reason
                    if d.logprobs:
                        c.logprobs = (c.logprobs or []) + d.logprobs
                if on_output:
                    on_output(out)
                if out.finished:
                    outs = [texts[out.request_id][i] for i in range(params.n)]
                    results[out.request_id] = GenerationOutput(
                        out.request_id, prompt_ids[out.request_id], outs, out.metrics
                    )
        return [results[rid] for rid in rids]

    def score(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: float32 [len(ids), n_vocab], row t predicting token t+1."""
        ids = list(ids)
        if not ids:
            raise ValueError("score() needs at least one token")
        if len(ids) > self.n_ctx:
            raise PromptTooLongError(f"{len(ids)} tokens exceed the context window of {self.n_ctx}")
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
                rows.append(self.engine.runner.run([item])[0])
            return np.concatenate(rows, axis=0)
        finally:
            bm.free(seq)
