"""What the server holds: its configuration (edgellm/config.py's ServerConfig), the loaded model (LLM)
with its chat template, and the request slots. The routes (app.py and the other APIs) read it; nothing
here knows a route.

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
from pathlib import Path
from typing import Any, TypeVar

from edgellm.chat.template import ChatPrompt, ChatTemplate, ChatTemplateError
from edgellm.config import ServerConfig
from edgellm.engine.checks import PromptTooLongError
from edgellm.llm import LLM
from edgellm.server.http.compat import ModelNames
from edgellm.server.http.errors import ApiError, request_error
from edgellm.server.metrics import ServerMetrics
from edgellm.tokenizer import TextTooLongError
from edgellm.vision.prompt import PreparedPrompt

log = logging.getLogger("edgellm.server")
T = TypeVar("T")


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.names = ModelNames(config.engine.model, config.served_model_names)
        self.model_name = self.names.primary
        self.metrics = ServerMetrics(self.model_name)
        self.llm: LLM = None  # type: ignore[assignment]  # set once loaded
        self.core_error: str | None = None  # why the engine core died, while a new one starts
        self.request_exit: Callable[[], None] = lambda: None  # set by run_server
        self.template: ChatTemplate | None = None
        self.template_error: str | None = None  # why chat requests cannot be served (broken template)
        # Work proportional to a request's input (templates, tokenizing, detokenizing) runs on these
        # threads, never on the event loop: a slow template or a megabyte prompt does not stall /health
        # or other requests (the tokenizers release the GIL on long texts; see tokenizer/bpe.py).
        self.work_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="edgellm-work")
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.in_flight = 0
        self.created = int(time.time())

    def load(self, progress: Callable[[str], None] | None = None) -> None:
        try:
            llm = LLM(config=self.config.engine, progress=progress)
            self.template, self.template_error = load_template(self.config, llm)
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

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a work thread (see work_pool)."""
        return await asyncio.get_running_loop().run_in_executor(self.work_pool, fn, *args)

    def admit(self, k: int) -> Callable[[], None]:
        """Reserve k request slots or raise 429; returns an idempotent release."""
        running, queued = self.config.engine.max_num_seqs, self.config.max_queue
        if self.in_flight + k > running + queued:
            raise ApiError(
                429,
                f"the server is at capacity ({self.in_flight} requests in flight, "
                f"{running} running + {queued} queued at most); retry later",
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


async def with_template(state: ServerState, fn: Callable[[ChatTemplate], T]) -> T:
    """fn(the chat template) off the event loop; no usable template, or an error of the template's: the
    400 saying so."""
    template = state.template
    if template is None:
        raise ApiError(400, f"chat is unavailable: {state.template_error}", param="messages")
    try:
        return await state.off_loop(fn, template)
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages") from None


async def render_chat_prompt(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    for_generation: bool = True,
) -> ChatPrompt:
    """The conversation rendered and tokenized off the event loop. `for_generation`: a prompt that
    cannot leave room for one generated token is refused by its size before it is tokenized."""
    try:
        return await with_template(
            state,
            lambda t: t.render_prompt(
                messages,
                state.llm.tokenizer,
                add_generation_prompt,
                allow_special_in_content=state.config.allow_special_in_content,
                tools=tools,
                template_kwargs=template_kwargs,
                max_tokens=state.llm.n_ctx - 1 if for_generation else None,
            ),
        )
    except TextTooLongError as e:  # (the model is loaded: a template is only set then)
        n_ctx = state.llm.n_ctx
        raise request_error(PromptTooLongError(e.num_tokens, n_ctx, at_least=True), n_ctx, True) from None


async def image_prompt_ids(state: ServerState, text: str, images: list[bytes]) -> PreparedPrompt:
    """A rendered chat prompt whose media markers stand for `images`, tokenized as libmtmd does with the
    images encoded (vision/prompt.py), off the event loop. A bad image, or images to a model started
    without --mmproj: the 400 naming it. BOS is not added again where the template wrote it."""
    llm = state.llm
    bos = llm.tokenizer.bos_id
    bos_text = llm.tokenizer.decode([bos]) if bos is not None else ""
    add_special = not (bos_text and text.startswith(bos_text))

    def build() -> PreparedPrompt:
        ids, media = llm.image_prompt({"prompt": text, "images": images, "add_special": add_special})
        return PreparedPrompt(ids, media)

    try:
        return await state.off_loop(build)
    except ValueError as e:
        raise ApiError(400, str(e), param="messages") from None

