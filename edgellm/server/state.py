"""What the server holds: its configuration, the loaded model (LLM) with its chat template, and the request
slots. The routes (app.py and the other APIs) read it; nothing here knows a route.

The model loads on a background thread after the socket is up, so /health can answer 503 while it
loads; every model endpoint answers 503 until then too. The engine core runs in its own process (see
engine/core_process.py): if it dies, in-flight requests get an error, /health answers 503 with the reason,
and a new core is started; if that fails too, the server exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.chat_template import ChatPrompt, ChatTemplate, ChatTemplateError
from edgellm.llm import LLM
from edgellm.reasoning import REASONING_FORMATS
from edgellm.sampling_defaults import check_sampling_defaults
from edgellm.server.auth import check_api_key_option
from edgellm.server.compat import ModelNames
from edgellm.server.errors import ApiError
from edgellm.server.metrics import ServerMetrics

log = logging.getLogger("edgellm.server")
DEFAULT_MAX_BODY_BYTES = 4 * 2**20


@dataclass
class ServerConfig:
    model: str
    backend: str = "cpu"
    ctx: int | None = None
    threads: int | None = None
    api_key: str | None = None
    max_queue: int = 64  # requests that may wait for a free slot beyond the running ones
    max_num_seqs: int = 16  # requests generated together
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of RAM (LLM's kv_cache_memory)
    kv_cache_dtype: str = "f16"  # LLM's kv_cache_dtype
    metrics_public: bool = False  # /metrics without the API key
    allow_special_in_content: bool = False  # parse control-token text typed in user/tool content
    chat_template_file: str | None = None  # instead of the GGUF's template
    served_model_names: tuple[str, ...] = ()  # names answered to (the first is reported); none: any name
    cors_origins: tuple[str, ...] = ()  # origins browsers may call from ("*": any); none: CORS off
    speculative: str | dict | None = None  # LLM's speculative ("ngram", "draft:PATH")
    num_speculative_tokens: int | None = None
    reasoning_format: str = "auto"  # edgellm.reasoning.REASONING_FORMATS
    reasoning_budget: int = -1  # reasoning tokens per reply: -1 unlimited, 0 no thinking
    # SamplingParams fields for requests that omit them (`serve --temperature ...`; sampling_defaults.py)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_api_key_option(self.api_key)
        check_sampling_defaults(self.sampling_defaults)
        if self.reasoning_format not in REASONING_FORMATS:
            choices = ", ".join(REASONING_FORMATS)
            raise ValueError(f"reasoning_format must be one of {choices}, got {self.reasoning_format!r}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be -1 (unlimited) or >= 0, got {self.reasoning_budget}")


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.names = ModelNames(config.model, config.served_model_names)
        self.model_name = self.names.primary
        self.metrics = ServerMetrics(self.model_name)
        self.llm: LLM = None  # type: ignore[assignment]  # set once loaded
        self.core_error: str | None = None  # why the engine core died, while a new one starts
        self.request_exit: Callable[[], None] = lambda: None  # set by run_server
        self.template: ChatTemplate | None = None
        self.template_error: str | None = None  # why chat requests cannot be served (broken template)
        # Templates render on their own threads: a slow one never blocks the event loop or other requests.
        self.template_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="edgellm-template")
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.in_flight = 0
        self.created = int(time.time())

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        try:
            c = self.config
            llm = LLM(
                c.model,
                backend=c.backend,
                n_ctx=c.ctx,
                threads=c.threads,
                max_num_seqs=c.max_num_seqs,
                kv_cache_memory=c.kv_cache_memory,
                kv_cache_dtype=c.kv_cache_dtype,
                progress=progress,
                speculative=c.speculative,
                num_speculative_tokens=c.num_speculative_tokens,
            )
            self.template, self.template_error = load_template(c, llm)
            llm.on_core_death = self._core_died
            self.llm = llm
            self.ready.set()
        except BaseException as e:
            self.load_error = e
            raise

    def _core_died(self, reason: str) -> None:
        """The engine core is gone (its requests have their errors): restart it on a helper thread."""
        log.error("%s; restarting the engine core", reason)
        self.core_error = reason

        def restart() -> None:
            try:
                self.llm.restart()
            except BaseException as e:  # noqa: BLE001 - no engine: the server stops, non-zero
                log.error("could not restart the engine core: %r", e)
                self.load_error = e
                self.request_exit()
                return
            self.core_error = None
            log.warning("engine core restarted")

        threading.Thread(target=restart, name="edgellm-core-restart", daemon=True).start()

    def admit(self, k: int) -> Callable[[], None]:
        """Reserve k request slots or raise 429; returns an idempotent release."""
        capacity = self.config.max_num_seqs + self.config.max_queue
        if self.in_flight + k > capacity:
            raise ApiError(
                429,
                f"the server is at capacity ({self.in_flight} requests in flight, "
                f"{self.config.max_num_seqs} running + {self.config.max_queue} queued at most); retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.in_flight += k
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= k

        return release


def load_template(config: ServerConfig, llm: LLM) -> tuple[ChatTemplate | None, str | None]:
    """The chat template, checked once with a plain conversation; a broken one is reported now and turns
    chat requests into 400s naming the problem, while completions keep working."""
    try:
        if config.chat_template_file is not None:
            source = Path(config.chat_template_file).read_text(encoding="utf-8")
            metadata = {**llm.metadata, "tokenizer.chat_template": source}
            template = ChatTemplate.from_metadata(metadata, llm.tokenizer)
            template.name = config.chat_template_file
        else:
            template = ChatTemplate.from_metadata(llm.metadata, llm.tokenizer)
        template.check()
        return template, None
    except ChatTemplateError as e:
        print(f"edgellm: WARNING: {e}; chat requests will be refused", flush=True)
        log.warning("%s", e)
        return None, str(e)


async def render_chat_prompt(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> ChatPrompt:
    if state.template is None:
        raise ApiError(400, f"chat is unavailable: {state.template_error}", param="messages")
    render = state.template.render_prompt
    try:
        return await asyncio.get_running_loop().run_in_executor(
            state.template_pool,
            lambda: render(
                messages,
                state.llm.tokenizer,
                add_generation_prompt,
                allow_special_in_content=state.config.allow_special_in_content,
                tools=tools,
                template_kwargs=template_kwargs,
            ),
        )
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages") from None
