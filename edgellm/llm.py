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
import itertools
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm.engine.checks import (
    PromptTooLongError,
    check_generative,
    check_prompt,
    check_request,
    encode_within,
)
from edgellm.engine.config import EngineConfig, kv_budget_bytes
from edgellm.engine.core_client import CoreClient, EngineDeadError
from edgellm.engine.frontend import RequestStream
from edgellm.engine.media import check_media_arch
from edgellm.engine.outputs import CompletionOutput, OutputCollector, RequestMetrics, RequestOutput
from edgellm.engine.protocol import EngineCoreRequest, EngineStats
from edgellm.engine.spec.config import SpeculativeConfig, check_draft_model
from edgellm.gguf.config import ModelConfig, config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.grammar.compile import check_for_vocabulary
from edgellm.llm_inputs import InputRequestsMixin, as_list
from edgellm.lora.choice import resolve_lora
from edgellm.models.catalog import resolve_model
from edgellm.quants.kv_cache import get_kv_cache_type
from edgellm.sampling.sampler import SamplingParams
from edgellm.vision.image import ImageError
from edgellm.vision.mmproj import VisionEncoder, load_mmproj
from edgellm.vision.prompt import PreparedPrompt, image_prompt

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


def slow_steps(msg: str) -> None:
    """LLM's progress when neither `verbose` nor `progress` is given (and `edgellm run`'s, `bench`'s): only
    what may take long, to stderr: fetching a model and compiling the kernels (a first start: about a
    minute on 2 cores, with a heartbeat line every 5 s), never a line on a warm start."""
    if "compil" in msg or "fetch" in msg or "download" in msg:
        print(f"edgellm: {msg}", file=sys.stderr, flush=True)


class LLM(InputRequestsMixin):
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
        `config` they override its fields); `model` likewise sets config.model. `progress(line)` hears the
        load's progress; by default only fetching and compiling are said, on stderr (`slow_steps`), and
        `verbose` prints every line there."""
        self._log = progress or (
            (lambda msg: print(f"edgellm: {msg}", file=sys.stderr, flush=True)) if verbose else slow_steps
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
        # images: the mmproj's encoder runs here, the engine gets embeddings (vision/prompt.py)
        self.vision: VisionEncoder | None = self._load_vision(self.engine_config.mmproj)
        self._rids = itertools.count()
        self.on_core_death: Callable[[str], None] | None = None
        self.core = self._start_core()

    def _load_vision(self, mmproj: str | None) -> VisionEncoder | None:
        """The mmproj given (GGUFError if it cannot be used); "none": no images; not given: the one
        mmproj*.gguf beside the model file if there is exactly one (as LM Studio and Ollama find it),
        skipped with a note when it is for another model or of a projector type not supported."""
        if mmproj == "none":
            return None
        if mmproj:
            check_media_arch(self.config.arch)
            return load_mmproj(mmproj, self.config.n_embd)
        found = sorted(self.path.parent.glob("mmproj*.gguf"))
        if len(found) != 1:
            return None
        try:
            check_media_arch(self.config.arch)
            encoder = load_mmproj(found[0], self.config.n_embd)
        except (GGUFError, ValueError, OSError) as e:
            self._log(f"not using {found[0].name} beside the model for images: {e}")
            return None
        self._log(f"images: using {found[0].name} (found beside the model; --mmproj none to turn off)")
        return encoder

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
        self.huge_pages: bool = info["huge_pages"]  # the prepared weights' pages (EngineConfig.huge_pages)
        self.compile_time: float = info["compile_time"]
        self.weight_bytes_per_token: int = info["weight_bytes_per_token"]
        # every weight the model holds (more than per token for a mixture of experts)
        self.weight_bytes_total: int = info["weight_bytes_total"]
        self.n_lora: int = len(info.get("lora", []))  # LoRA adapters loaded (ids 0..n_lora - 1)
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

    # ---- LoRA adapters (LLM(model, lora=[path | (path, scale), ...]); a request's SamplingParams.lora) ----
    def lora_adapters(self) -> list[dict]:
        """The loaded adapters as llama-server's GET /lora-adapters lists them: [{id, path, scale}]."""
        return self.core.call("lora_adapters")

    def load_lora(self, path: str | Path, scale: float = 1.0) -> int:
        """Load one more adapter while running, at global scale `scale` (0: only for requests that name
        it); returns its id. Requests already running are unchanged. LoraError if it does not fit."""
        listed = self.core.call("load_lora", str(path), scale)
        self.n_lora = len(listed)
        return listed[-1]["id"]

    def set_lora_scales(self, scales: list | dict) -> list[dict]:
        """New global scales ([{id, scale}] or {id: scale}; an adapter not named is at 0), for requests
        submitted from now on; returns the new list."""
        return self.core.call("set_lora_scales", scales)

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
        ids = self.encode_prompt(prompt)
        check_prompt(ids, self.n_ctx, self.tokenizer.vocab_size)
        return ids

    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):  # at most n_ctx - 1 prompt tokens leave room for one generated
            return encode_within(self.tokenizer, prompt, self.n_ctx, self.n_ctx - 1)
        return list(prompt)

    # ---- requests ------------------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> EngineCoreRequest:
        """The front-end's one validation of a generation request, whoever sends it (submit and stream, so
        the server and the TUI too): the prompt is not empty, its ids are in the vocabulary and leave room
        for a generated token, logit_bias names ids of the vocabulary, and a grammar was compiled for this
        tokenizer. Raises ValueError naming the problem (PromptTooLongError, TokenIdError); the engine
        core guards its kernels with the same checks. `group`: as submit's."""
        check_generative(self.config)  # an encoder embeds only: EmbeddingOnlyError, a ValueError
        media = None
        if isinstance(prompt, dict):  # {"prompt": text with <__media__> markers, "images": [bytes | path]}
            ids, media = self.image_prompt(prompt)
        elif isinstance(prompt, PreparedPrompt):  # encoded already (the server, off its event loop)
            ids, media = prompt.token_ids, prompt.media
        else:
            ids = self.encode_prompt(prompt)
        check_request(ids, params, self.n_ctx, self.tokenizer.vocab_size)
        step = self.engine_config.max_num_batched_tokens
        if media and any(m.non_causal and m.end - m.start > step for m in media):
            raise ImageError(f"an image's tokens do not fit one step of {step} (max_num_batched_tokens)")
        check_for_vocabulary(params, (self.tokenizer, self.config.n_vocab))  # compiled in a worker, not here
        resolve_lora(params.lora, [0.0] * self.n_lora)  # an adapter id that is not loaded
        rid = request_id if request_id is not None else f"req-{next(self._rids)}"
        return EngineCoreRequest(rid, ids, params, priority, group, media=media or None)

    def image_prompt(self, prompt: dict) -> tuple[list[int], list]:
        """A prompt with images: {"prompt": text whose "<__media__>" markers stand for the images,
        "images": [encoded image bytes, or a file path]} -> (token ids, MediaSpans). ImageError (a
        ValueError) for a model without an mmproj, a bad image or a marker count that does not match."""
        text, images = prompt.get("prompt"), prompt.get("images", [])
        if not isinstance(text, str) or not isinstance(images, list | tuple):
            raise ValueError('an image prompt is {"prompt": str, "images": [bytes or path, ...]}')
        data = [im if isinstance(im, bytes | bytearray) else Path(im).read_bytes() for im in images]
        add_special = prompt.get("add_special", True)
        return image_prompt(self.tokenizer, self.vision, text, [bytes(d) for d in data], add_special)

    def add_request(self, req: EngineCoreRequest, deliver: Callable[[Any], None]) -> None:
        """Send a request make_request built to the engine core; `deliver` as submit's."""
        core, params = self.core, req.sampling_params
        assert params is not None  # a generation
        stream = RequestStream(core, self.tokenizer, req.request_id, req.prompt_token_ids, params, deliver)
        core.add(req, stream)

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
        req = self.make_request(prompt, params, request_id, priority, group)
        self.add_request(req, deliver)
        return req.request_id, req.prompt_token_ids

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
        prompts = as_list(prompts)
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
        prompts = as_list(prompts)

        async def one(p: str | list[int] | dict) -> GenerationOutput:
            c, rid = OutputCollector(params.n), ""
            # a prompt with images is encoded off the event loop
            req = await asyncio.to_thread(self.make_request, p, params) if isinstance(p, dict) else p
            async for out in self.stream(req, params):
                rid = out.request_id
                c.push(out)
            ids = req.prompt_token_ids if isinstance(req, EngineCoreRequest) else self.encode_prompt(p)
            return _result(rid, ids, c)

        return list(await asyncio.gather(*[one(p) for p in prompts]))

    async def stream(
        self,
        prompt: str | Sequence[int] | EngineCoreRequest,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        group: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yields one prompt's RequestOutput per engine step until it finishes. Leaving early (a client
        that went away, a cancelled task) aborts the request and frees its KV blocks at once. `prompt`
        may be a request make_request built (the server checks its requests before admitting them): it
        carries its own params, id, priority and group."""
        if isinstance(prompt, EngineCoreRequest):
            req = prompt
        else:
            req = self.make_request(prompt, params or SamplingParams(), request_id, priority, group)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        rid = req.request_id

        def deliver(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
                self.core.abort(rid)

        self.add_request(req, deliver)
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
