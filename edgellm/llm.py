"""The Python API: `LLM` loads a model (catalog name or .gguf path) and runs it through the engine core.

The core (model, scheduler, sampler, kernels) runs in its own process on that process's main thread (see
engine/core_process.py); `LLM` is the front-end: checks, tokenization, detokenization, stop strings. One
`LLM` may be used from any number of threads (`generate` blocks only its caller) and from asyncio
(`agenerate`, `stream`). The core is a process for `LLM` too: in-process it would run on a thread that is
not the main one (OpenMP's slow case) or on the callers' threads (not shareable). Its cost is one pipe
message per step and a process start; `edgellm bench` measured no batch-1 loss against the old in-process
loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.catalog import resolve_model
from edgellm.engine.checks import PromptTooLongError, check_embedding_input, check_prompt
from edgellm.engine.config import EngineConfig, kv_budget_bytes
from edgellm.engine.core_client import CoreClient, EngineDeadError
from edgellm.engine.frontend import RequestStream
from edgellm.engine.outputs import CompletionOutput, OutputCollector, RequestMetrics, RequestOutput
from edgellm.engine.protocol import EngineStats
from edgellm.engine.spec.config import SpeculativeConfig, check_draft_model
from edgellm.gguf.config import ModelConfig, config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.grammar import check_for_vocabulary
from edgellm.quants.kv_cache import get_kv_cache_type
from edgellm.sampling import SamplingParams

__all__ = ["LLM", "EngineDeadError", "GenerationOutput", "PromptTooLongError", "kv_budget_bytes"]


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

    @property
    def reasoning(self) -> str:
        return self.outputs[0].reasoning


def _result(rid: str, prompt_ids: list[int], c: OutputCollector) -> GenerationOutput:
    assert c.metrics is not None
    return GenerationOutput(rid, prompt_ids, c.outputs, c.metrics)


class LLM:
    def __init__(
        self,
        model: str | Path | None = None,
        *,
        config: EngineConfig | None = None,
        verbose: bool = False,
        progress: Callable[[str], None] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """`config`, or EngineConfig's fields as keywords (n_ctx=, threads=, kv_cache_dtype=, ...; with
        `config` they override its fields); `model` likewise sets config.model."""
        self._log = progress or (
            (lambda msg: print(f"edgellm: {msg}", file=sys.stderr, flush=True)) if verbose else None
        )
        changes = engine_kwargs | ({} if model is None else {"model": model})
        config = config or EngineConfig()
        self.engine_config: EngineConfig = dataclasses.replace(config, **changes) if changes else config
        spec_config = self.engine_config.speculative_config()
        self.speculative: SpeculativeConfig | None = spec_config
        self.path: Path = resolve_model(self.engine_config.model)
        gguf = load_gguf(self.path)  # mmapped: the header and metadata only are read here
        self.config: ModelConfig = config_from_gguf(gguf)
        validate_model(gguf, self.config)  # before any kernel sees a shape the file claims
        # an unknown dtype, or head sizes it cannot hold, fail here, before a process starts
        kv_dtype = self.engine_config.kv_cache_dtype
        get_kv_cache_type(kv_dtype).check_head_dims(self.config.head_dim, self.config.head_dim_v)
        self.metadata = gguf.metadata
        self.tokenizer = tokenizer_from_gguf(gguf)
        if spec_config is not None and spec_config.method == "draft":
            spec_config.model = str(check_draft_model(spec_config.model, gguf, self.config))
        # what the core process gets: the model as a path, the draft model's resolved
        self.spec = dataclasses.replace(self.engine_config, model=str(self.path), speculative=spec_config)
        self._rids = itertools.count()
        self.on_core_death: Callable[[str], None] | None = None
        self.core = self._start_core()

    def _start_core(self) -> CoreClient:
        me = weakref.ref(self)  # the core client's threads must not keep this LLM alive

        def on_death(reason: str) -> None:
            llm = me()
            if llm is not None and llm.on_core_death is not None:
                llm.on_core_death(reason)

        core = CoreClient(self.spec, self._log, on_death=on_death)
        weakref.finalize(self, core.shutdown, 1.0)  # a dropped LLM takes its core process with it
        info = core.info
        self.n_ctx: int = info["n_ctx"]
        self.threads: int = info["threads"]
        self.num_kv_blocks: int = info["num_kv_blocks"]
        self.block_size: int = info["block_size"]
        self.kv_cache_bytes: int = info["kv_cache_bytes"]
        self.kv_cache_dtype: str = info["kv_cache_dtype"]
        self.kv_bytes_per_token: int = info["kv_bytes_per_token"]
        self.load_time: float = info["load_time"]
        self.compile_time: float = info["compile_time"]
        self.weight_bytes_per_token: int = info["weight_bytes_per_token"]
        # every weight the model holds (more than per token for a mixture of experts)
        self.weight_bytes_total: int = info["weight_bytes_total"]
        return core

    def restart(self) -> None:
        """Start a fresh core process after the last one died (the server's recovery)."""
        old = self.core
        self.core = self._start_core()
        old.shutdown(timeout=1)

    @property
    def healthy(self) -> bool:
        return self.core.healthy

    @property
    def error(self) -> str | None:
        """Why the core is gone, or None while it runs."""
        return self.core.error

    def stats(self) -> EngineStats:
        return self.core.stats()

    def shutdown(self) -> None:
        self.core.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- text <-> ids --------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """A prompt as checked token ids: text gets BOS when the model's metadata says so."""
        ids = self.tokenizer.encode(prompt, add_special=True) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids, self.n_ctx, self.tokenizer.vocab_size)
        return ids

    # ---- requests ------------------------------------------------------------------------------
    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        deliver: Callable[[Any], None],
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> tuple[str, list[int]]:
        """Start one request; `deliver` gets its RequestOutput per step (or one exception), on the core
        client's thread. `group`: the caller's request this is part of (the engine shares each step's
        tokens out per group), None: its own. Returns (request id, prompt ids)."""
        ids = self.prompt_ids(prompt)
        check_for_vocabulary(params, (self.tokenizer, self.config.n_vocab))  # in a worker, not here
        rid = request_id if request_id is not None else f"req-{next(self._rids)}"
        core = self.core
        stream = RequestStream(core, self.tokenizer, rid, ids, params, deliver)
        core.add(rid, ids, params, stream, priority, group)
        return rid, ids

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def abort_all(self, request_ids: list[str]) -> None:
        """Abort several requests at once: the engine drops them all before its next step."""
        self.core.abort_all(request_ids)

    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | None = None,
        on_output: Callable | None = None,
    ) -> list[GenerationOutput]:
        """Run every prompt through the engine together (continuous batching); results in prompt order.
        A prompt is text (BOS added when the model's metadata says so) or a list of token ids. Blocks only
        the calling thread; other threads may generate on the same LLM at the same time."""
        import queue

        params = params or SamplingParams()
        prompts = _as_list(prompts)
        q: queue.Queue = queue.Queue()
        collectors: dict[str, tuple[list[int], OutputCollector]] = {}
        group = self._new_group()
        try:
            for p in prompts:
                rid, ids = self.submit(p, params, q.put, group=group)
                collectors[rid] = (ids, OutputCollector(params.n))
            left = len(collectors)
            while left:
                out = q.get()
                if isinstance(out, BaseException):
                    raise out
                collectors[out.request_id][1].push(out)
                if on_output:
                    on_output(out)
                left -= out.finished
        except BaseException:
            self.core.abort_all([rid for rid, (_, c) in collectors.items() if not c.finished])
            raise
        return [_result(rid, ids, c) for rid, (ids, c) in collectors.items()]

    async def agenerate(
        self, prompts: str | list[int] | Sequence[str | list[int]], params: SamplingParams | None = None
    ) -> list[GenerationOutput]:
        """`generate` for an asyncio app: the event loop keeps running while the core works."""
        params = params or SamplingParams()
        prompts = _as_list(prompts)

        async def one(p: str | list[int]) -> GenerationOutput:
            c, rid = OutputCollector(params.n), ""
            async for out in self.stream(p, params):
                rid = out.request_id
                c.push(out)
            return _result(rid, [], c)

        results = await asyncio.gather(*[one(p) for p in prompts])
        for p, r in zip(prompts, results, strict=True):
            r.prompt_token_ids = self.prompt_ids(p)
        return list(results)

    async def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yields one prompt's RequestOutput per engine step until it finishes. Leaving early (a client
        that went away, a cancelled task) aborts the request and frees its KV blocks at once."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        rid = None

        def deliver(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
                if rid is not None:
                    self.core.abort(rid)

        rid, _ = self.submit(prompt, params or SamplingParams(), deliver, request_id, priority, group)
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.core.abort(rid)

    def score(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: float32 [len(ids), n_vocab], row t predicting token t+1."""
        ids = list(ids)
        if not ids:
            raise ValueError("score() needs at least one token")
        if len(ids) > self.n_ctx:
            raise PromptTooLongError(
                len(ids), self.n_ctx, f"{len(ids)} tokens exceed the context window of {self.n_ctx}"
            )
        return self.core.call("score", ids)

    # ---- embeddings ----------------------------------------------------------------------------
    def embedding_ids(self, text: str | Sequence[int]) -> list[int]:
        """An input to embed as checked token ids (text gets BOS when the model's metadata says so); unlike
        a prompt it may fill the whole context window. Longer inputs raise PromptTooLongError."""
        ids = self.tokenizer.encode(text, add_special=True) if isinstance(text, str) else list(text)
        check_embedding_input(ids, self.n_ctx, self.tokenizer.vocab_size)
        return ids

    def submit_embedding(
        self, ids: list[int], deliver: Callable[[Any], None], priority: int = 0, group: str | None = None
    ) -> str:
        """Start one embedding request through the engine (batched with whatever else runs); `deliver`
        gets its [n_embd] float32 vector, or an exception, on the core client's thread. `group`: as
        submit's (embed and aembed give all the inputs of one call one group)."""
        rid = f"emb-{next(self._rids)}"
        self.core.add_embedding(rid, ids, lambda item: deliver(_embedding(item)), priority, group)
        return rid

    def _new_group(self) -> str:
        return f"call-{next(self._rids)}"

    def embed(self, inputs: str | Sequence[int] | Sequence[str | Sequence[int]]) -> np.ndarray:
        """Embeddings: float32 [len(inputs), n_embd], each row the input's final hidden states (after the
        output norm) pooled as the model's GGUF says (mean unless its pooling_type says cls or last) and
        L2-normalized. An input is text or token ids; a single one gives one row."""
        import queue

        ids = [self.embedding_ids(x) for x in _as_list(inputs)]
        out = np.empty((len(ids), self.config.n_embd), np.float32)
        q: queue.Queue = queue.Queue()
        rids, group = [], self._new_group()
        try:
            for i, x in enumerate(ids):
                rids.append(self.submit_embedding(x, lambda v, i=i: q.put((i, v)), group=group))
            for _ in ids:
                i, v = q.get()
                if isinstance(v, BaseException):
                    raise v
                out[i] = v
        except BaseException:
            self.core.abort_all(rids)  # a no-op for those that finished
            raise
        return out

    async def aembed(self, ids: list[list[int]]) -> np.ndarray:
        """`embed` of checked token ids (embedding_ids) for an asyncio app; cancelling it aborts them."""
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in ids]

        def settle(fut: asyncio.Future, v: Any) -> None:
            if not fut.done():  # (cancelled: nobody waits any more)
                fut.set_exception(v) if isinstance(v, BaseException) else fut.set_result(v)

        rids, done, group = [], False, self._new_group()
        try:
            for x, f in zip(ids, futs, strict=True):
                deliver = functools.partial(loop.call_soon_threadsafe, settle, f)
                rids.append(self.submit_embedding(x, deliver, group=group))
            vecs = await asyncio.gather(*futs)
            done = True
        finally:
            if not done:
                self.core.abort_all(rids)
        return np.stack(vecs) if vecs else np.empty((0, self.config.n_embd), np.float32)


def _embedding(item: Any) -> Any:
    """A core client sink item for an embedding request -> its vector, or the exception as it came."""
    return item if isinstance(item, BaseException) else item[-1][0].embedding


def _as_list(prompts: Any) -> list:
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)
