"""`edgellm chat`: the Textual chat app. It knows the model only through a `ChatBackend`."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Label, LoadingIndicator
from textual.worker import Worker

from edgellm.cpu_topology import physical_cores
from tui.actions import ConversationActions
from tui.backend import FRAME_INTERVAL_S, ChatBackend, env_number, with_system_prompt
from tui.messages import BackendError, BackendInfo, ChatMessage, GenerationSettings, StreamDelta, StreamDone
from tui.storage import Conversation, ConversationStore, SettingsStore, StoredMessage
from tui.widgets import ConversationList, ConversationView, LoadingPanel, PromptInput, StatusBar

BackendFactory = Callable[[str], ChatBackend]


def catalog_options() -> list[tuple[str, str]]:
    """(label, name) for every catalog model, saying which still need a download, then every model
    downloaded from Hugging Face (hub.py)."""
    from edgellm.models.catalog import CATALOG, local_path
    from edgellm.models.hub import cached_models

    missing = "  (not downloaded)"
    return [
        (f"{name}  {e.size_bytes / 1e6:.0f} MB {e.quant}{'' if local_path(e) else missing}", name)
        for name, e in CATALOG.items()
    ] + [(f"{m.name}  {m.size_bytes / 1e6:.0f} MB", m.name) for m in cached_models()]


# The engine's kernels run on every core, so drawing a frame costs the engine about (the UI's CPU) /
# (cores) of its speed: the default budget keeps that near DRAWING_COST_TO_ENGINE. On 2 cores it is 7% of
# one core (a long reply redraws every ~0.4 s here), on 8 cores 28%.
DRAWING_COST_TO_ENGINE = 0.035
DRAW_CPU_SHARE = env_number(
    "EDGELLM_UI_CPU_SHARE", min(1.0, DRAWING_COST_TO_ENGINE * physical_cores()), 0.01, 1.0
)  # see ChatApp.draw_cpu_share


class ChatApp(ConversationActions, App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "edgellm chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+l", "edit_last", "Edit last"),
        Binding("ctrl+o", "copy_reply", "Copy reply"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("f2", "rename", "Rename", show=False),  # listed under the sidebar instead
        Binding("f8", "delete", "Delete", show=False),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        backend_factory: BackendFactory,
        model: str,
        store: ConversationStore | None = None,
        settings_store: SettingsStore | None = None,
        model_options: list[tuple[str, str]] | None = None,
        save_interval: float = 1.0,
    ) -> None:
        super().__init__()
        self.backend_factory = backend_factory
        self.model = model
        self.store = store or ConversationStore()
        self.settings_store = settings_store or SettingsStore(self.store.root.parent)
        self.settings, _ = self.settings_store.load()
        # the catalog's list is built again each time Settings opens: a model downloaded since (the first
        # start's own download, `edgellm pull` in another terminal) no longer says "(not downloaded)"
        self._options_from_catalog = model_options is None
        self.model_options = model_options if model_options is not None else catalog_options()
        self.save_interval = save_interval  # seconds between saves of a streaming reply
        # Redraws of a streaming reply: at most 15 a second, and no more often than keeps the UI's CPU
        # (a frame of a long reply costs ~10-30 ms) under draw_cpu_share of one core. The engine's
        # kernels run on the same cores, and each of their parallel regions that finds a core busy with
        # the UI waits for it: at 15 frames a second the chat streamed at 0.7-0.8x `edgellm bench`'s
        # decode speed on 2 cores (scripts/bench/chat_speed.py); see DRAW_CPU_SHARE.
        self.draw_interval = FRAME_INTERVAL_S
        self.draw_cpu_share = DRAW_CPU_SHARE
        self.backend: ChatBackend | None = None
        self.info: BackendInfo | None = None
        self.state = "loading"  # on_mount starts the load; the first frame already says so
        # replying: from start_reply (before the worker runs) until what came is drawn and saved. A stop
        # sets reply_stop, and cancels the worker only while reply_waiting (for the backend's next event
        # or the user's answer), never mid-frame; otherwise the worker stops at its next check.
        self.replying = False
        self.reply_stop = asyncio.Event()
        self.reply_waiting = False
        self.reply_worker: Worker | None = None
        self.conversation = Conversation.new(model)
        self.last_ttft: float | None = None
        self.last_tps: float | None = None
        self.last_usage: int | None = None  # prompt+reply tokens the server reported (remote backends)

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            with Vertical(id="sidebar"):
                yield Label("Conversations", id="sidebar-title")
                yield ConversationList(id="conversations")
                yield Label("f2 rename · f8 delete", id="sidebar-keys")
            with Vertical(id="main"):
                yield LoadingPanel(loading_title(self.model), id="loading")
                yield ConversationView(id="chat")
                yield PromptInput(id="prompt")
        yield StatusBar(id="status", markup=False)
        yield Footer()

    def current_model_options(self) -> list[tuple[str, str]]:
        """The Settings screen's model list as it is now (model_options, refreshed from the catalog)."""
        if self._options_from_catalog:
            self.model_options = catalog_options()
        return self.model_options

    # ---- views ---------------------------------------------------------------------------------
    @property
    def chat(self) -> ConversationView:
        return self.query_one("#chat", ConversationView)

    @property
    def prompt_input(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    def prompt_messages(self, conv: Conversation | None = None) -> list[ChatMessage]:
        return with_system_prompt((conv or self.conversation).context_messages(), self.settings)

    def context_used(self) -> tuple[int | None, bool]:
        """(tokens the conversation takes as it would be sent, whether that is the server's last usage
        figure instead); None while generating or when nobody can tell."""
        if self.backend is None or self.info is None or self.state == "generating":
            return None, False
        messages = self.prompt_messages()
        if not messages:  # a new chat: nothing to send yet (chat templates reject an empty conversation)
            return 0, False
        try:
            used = self.backend.count_tokens(messages)
        except BackendError:  # the status bar shows "?"; sending the same messages reports the error
            used = None
        if used is None and self.last_usage is not None:
            return self.last_usage, True
        return used, False

    def update_status(self) -> None:
        used, approx = self.context_used()
        n_ctx = self.info.n_ctx if self.info else None
        status = self.query_one(StatusBar)
        speculation = getattr(self.backend, "speculation", None)
        spec = speculation() if speculation is not None else None
        status.show(self.model, used, n_ctx, self.last_ttft, self.last_tps, self.state, approx, spec)

    async def refresh_sidebar(self) -> None:
        await self.query_one(ConversationList).show(self.store.list(), self.conversation.id)

    async def on_mount(self) -> None:
        await self.refresh_sidebar()
        self.update_status()
        self.prompt_input.focus()
        self.load_model(self.model)

    async def on_unmount(self) -> None:
        # Closing the app mid-reply: what streamed so far is already in the message; keep it.
        self.save_conversation()
        if self.backend is not None:
            backend, self.backend = self.backend, None
            try:
                await backend.close()
            except Exception:  # shutting down: a failing close must not turn into a traceback
                pass

    def save_conversation(self, conv: Conversation | None = None) -> None:
        conv = conv or self.conversation
        if conv.messages:
            self.store.save(conv)

    # ---- model loading -------------------------------------------------------------------------
    @work(group="load", exclusive=True, exit_on_error=False)
    async def load_model(self, model: str) -> None:
        await self.stop_reply()
        old, self.backend, self.info = self.backend, None, None
        if old is not None:
            await old.close()
        panel = self.query_one(LoadingPanel)
        panel.lines.clear()
        panel.set_title(loading_title(model))
        panel.query_one(LoadingIndicator).display = True
        panel.remove_class("failed")
        panel.display = True
        self.model, self.state = model, "loading"
        self.update_status()
        backend = self.backend_factory(model)
        try:
            info = await backend.load(panel.add_line)
        except Exception as e:  # BackendError carries a readable sentence; anything else gets its type
            text = str(e) if isinstance(e, BackendError) else f"{type(e).__name__}: {e}"
            panel.set_title(f"Could not start {model or 'the chat'}")
            panel.add_line(text)
            panel.add_line("Pick another model in Settings (Ctrl+S) or quit with Ctrl+Q.")
            panel.query_one(LoadingIndicator).display = False
            panel.add_class("failed")
            self.state = "error"
            self.update_status()
            return
        self.backend, self.info, self.model = backend, info, info.model
        if not self.settings_store.path.exists():  # settings never saved: the model's recommended ones
            for name in ("temperature", "top_p"):
                if name in info.recommended:
                    setattr(self.settings, name, info.recommended[name])
        panel.display = False
        self.state = "ready"
        self.update_status()

    # ---- sending and replies -------------------------------------------------------------------
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        if self.replying:
            self.notify("A reply is streaming: wait, or stop it with Esc.", severity="warning")
            return
        if self.backend is None:
            self.notify("The model is not ready yet.", severity="warning")
            return
        self.prompt_input.clear()
        conv = self.conversation
        message = StoredMessage("user", event.text.strip("\n"))
        if not conv.messages:
            conv.title = message.content.strip().splitlines()[0][:40]
        conv.messages.append(message)
        await self.chat.add(message)
        self.save_conversation(conv)
        await self.refresh_sidebar()
        self.start_reply()

    def start_reply(self) -> None:
        """Reply to the open conversation; from now on Esc stops the reply, whatever stage it is at."""
        if self.replying or self.backend is None:
            return
        self.replying = True
        self.reply_stop = asyncio.Event()
        self.reply_worker = self.reply(self.reply_stop)

    @work(group="reply", exclusive=True, exit_on_error=False)
    async def reply(self, stop: asyncio.Event) -> None:
        conv, backend = self.conversation, self.backend
        try:
            if backend is None or not (stop.is_set() or await self._ask_to_drop(conv)):
                return
            self.state = "generating"
            self.update_status()
            await self._stream_reply(conv, backend, stop)
        finally:
            self.replying = self.reply_waiting = False
            if self.state == "generating":
                self.state = "ready"
            self.update_status()

    async def _stream_reply(self, conv: Conversation, backend: ChatBackend, stop: asyncio.Event) -> None:
        """Stream the reply into a new bubble until it ends or `stop` is set; whatever came is drawn and
        saved, a stopped reply (even one stopped before its first token) labelled so."""
        messages = self.prompt_messages(conv)
        reply = StoredMessage("assistant", "", partial=True)
        conv.messages.append(reply)
        view = await self.chat.add(reply, streaming=True)
        view.start_stream()
        done: StreamDone | None = None
        error: str | None = None
        last_save = next_draw = time.monotonic()
        cpu_at_draw = time.process_time()
        undrawn = ""
        reasoning_undrawn = False
        speed: tuple[float | None, float | None] = (None, None)  # the last delta's (ttft, tok/s)
        try:
            if stop.is_set():  # stopped before the request went out: nothing to ask the backend for
                return
            async with aclosing(backend.stream(messages, self.settings)) as events:
                self.reply_waiting = True
                async for event in events:  # a stop while waiting here cancels the wait (stop_reply)
                    self.reply_waiting = False
                    if isinstance(event, StreamDelta):
                        reply.content += event.text
                        reply.reasoning += event.reasoning
                        speed = (event.ttft, event.tokens_per_s) if event.ttft is not None else speed
                        undrawn += event.text
                        reasoning_undrawn = reasoning_undrawn or bool(event.reasoning)
                        # drawing is the UI's main cost and takes the engine's cores: see draw_cpu_share
                        # (end_stream draws whatever is left)
                        if time.monotonic() >= next_draw:
                            if reasoning_undrawn:
                                await view.show_reasoning()
                                reasoning_undrawn = False
                            await view.append(undrawn)
                            undrawn = ""
                            self.chat.call_after_refresh(self.chat.follow)
                            cpu_now = time.process_time()
                            cpu, cpu_at_draw = cpu_now - cpu_at_draw, cpu_now
                            share = self.draw_cpu_share
                            wait = max(self.draw_interval, cpu / share if share else 0)
                            next_draw = time.monotonic() + wait
                        if time.monotonic() - last_save >= self.save_interval:
                            self.save_conversation(conv)  # closing mid-reply must lose nothing
                            last_save = time.monotonic()
                    else:
                        done = event
                    if stop.is_set():  # pressed while this event was drawn: it is kept, the rest is not
                        break
                    self.reply_waiting = True
        except BackendError as e:
            error = str(e)
        except Exception as e:  # shown in the app, never as a traceback on the terminal
            error = f"{type(e).__name__}: {e}"
        finally:  # also on a stop (maybe a cancellation): keep the partial reply
            self.reply_waiting = False
            reply.partial = done is None
            if done is not None:
                speed = (done.ttft, done.tokens_per_s)
                if done.prompt_tokens is not None:
                    self.last_usage = done.prompt_tokens + done.completion_tokens
            if done is not None or speed[0] is not None:  # a stopped reply keeps the figures it streamed at
                reply.ttft, reply.tokens_per_s = speed
                self.last_ttft, self.last_tps = speed
            if reasoning_undrawn:
                await view.show_reasoning()
            await view.end_stream()
            self.chat.call_after_refresh(self.chat.follow)  # a user who scrolled up to read stays there
            if not reply.content and not reply.reasoning and not (reply.partial and error is None):
                # it failed or was empty: no empty bubble (a stopped one stays, to say the stop took)
                conv.messages.remove(reply)
                await view.remove()
            self.save_conversation(conv)
        if error:
            self.state = "error"
            await self.chat.add_notice(f"Error: {error}")
        elif done is not None and done.finish_reason == "length":
            await self.chat.add_notice(
                f"The reply stopped at its length limit ({done.completion_tokens} tokens): raise max tokens "
                "in Settings (Ctrl+S), or free context with a new chat.",
                kind="info",
            )

    async def stop_reply(self) -> None:
        """Stop the reply (if any) and wait until what came of it is drawn and saved. A worker drawing a
        frame finishes it (cancelling it there would lose the frame); one waiting is cancelled at once."""
        if not self.replying:
            return
        self.reply_stop.set()
        if self.reply_waiting and self.reply_worker is not None:
            self.reply_worker.cancel()
        while self.replying:  # the worker's finally saves the partial text, then clears the flag
            await asyncio.sleep(0.01)

    async def action_stop(self) -> None:
        if self.replying:
            await self.stop_reply()
            if self.conversation.messages and self.conversation.messages[-1].partial:
                self.notify("Reply stopped; the partial text is kept.", timeout=2)


def loading_title(model: str) -> str:
    return f"Loading {model or 'the server model'}..."


def run_chat(
    model: str | None = None, url: str | None = None, api_key: str | None = None, **llm_kwargs: Any
) -> None:
    """`edgellm chat [MODEL] [--url URL]`: chat with an in-process model (llm_kwargs: its EngineConfig, e.g.
    kv_cache_dtype), or with a server at `url`."""
    if url:
        from tui.remote_backend import RemoteBackend

        def factory(name: str) -> ChatBackend:
            return RemoteBackend(url, name or None, api_key)

        app = ChatApp(factory, model or "")
    else:
        from edgellm.models.catalog import DEFAULT_MODEL
        from tui.local_backend import LocalBackend

        app = ChatApp(functools.partial(LocalBackend, **llm_kwargs), model or DEFAULT_MODEL)
    app.run()


__all__ = ["ChatApp", "GenerationSettings", "run_chat"]
