"""The conversation-level actions of the chat app (regenerate, edit, copy, new/open/rename/delete, settings,
dropping the oldest turns when the context is full), kept apart from the streaming machinery in tui/app.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tui.context import check_context, drop_oldest
from tui.screens import ConfirmScreen, RenameScreen, SettingsResult, SettingsScreen
from tui.storage import Conversation
from tui.widgets import ConversationList

if TYPE_CHECKING:
    from tui.backend import ChatBackend
    from tui.messages import BackendInfo, GenerationSettings
    from tui.storage import ConversationStore, SettingsStore
    from tui.widgets import ConversationView, PromptInput


class ChatAppParts(Protocol):
    """What the actions use of the app they are mixed into (ChatApp, and textual's App under it)."""

    model: str
    model_options: list[tuple[str, str]]
    backend: ChatBackend | None
    conversation: Conversation
    replying: bool
    reply_waiting: bool
    info: BackendInfo | None
    settings: GenerationSettings
    store: ConversationStore
    settings_store: SettingsStore

    @property
    def chat(self) -> ConversationView: ...
    @property
    def prompt_input(self) -> PromptInput: ...
    def start_reply(self) -> None: ...
    async def stop_reply(self) -> None: ...
    def save_conversation(self, conv: Conversation | None = None) -> None: ...
    def update_status(self) -> None: ...
    async def refresh_sidebar(self) -> None: ...
    def load_model(self, model: str) -> Any: ...
    def current_model_options(self) -> list[tuple[str, str]]: ...
    def copy_to_clipboard(self, text: str) -> None: ...
    def notify(self, message: str, **kw: Any) -> None: ...
    def push_screen(self, screen: Any, callback: Any = None) -> Any: ...
    async def push_screen_wait(self, screen: Any) -> Any: ...


if TYPE_CHECKING:
    _Base = ChatAppParts
else:
    _Base = object


class ConversationActions(_Base):
    """Mixed into ChatApp; every method relies on its views, store and reply state."""

    async def action_regenerate(self) -> None:
        if self.replying or self.backend is None:
            return
        conv = self.conversation
        if conv.messages and conv.messages[-1].role == "assistant":
            conv.messages.pop()
            await self.chat.message_views()[-1].remove()
        if conv.messages and conv.messages[-1].role == "user":
            # notices about the last answer ("stopped at its length limit", an error) go with it
            await self.chat.remove_notices_after(self.chat.message_views()[-1])
            self.start_reply()

    async def action_edit_last(self) -> None:
        """Put the last user message back in the box and forget it and its reply; Enter resends."""
        if self.replying:
            return
        conv = self.conversation
        users = [i for i, m in enumerate(conv.messages) if m.role == "user"]
        if not users:
            return
        text = conv.messages[users[-1]].content
        del conv.messages[users[-1] :]
        self.save_conversation(conv)
        views = self.chat.message_views()
        await self.chat.remove_notices_after(views[users[-1]])  # about the turns that go
        for view in views[users[-1] :]:
            await view.remove()
        self.prompt_input.load_text(text)
        self.prompt_input.move_cursor(self.prompt_input.document.end)
        self.prompt_input.focus()
        self.update_status()

    def action_copy_reply(self) -> None:
        replies = [m for m in self.conversation.messages if m.role == "assistant"]
        if replies:
            self.copy_to_clipboard(replies[-1].content)
            self.notify("Last reply copied to the clipboard", timeout=2)

    async def open_conversation(self, conv: Conversation) -> None:
        await self.stop_reply()
        self.conversation = conv
        await self.chat.show(conv)
        await self.refresh_sidebar()
        self.update_status()
        self.prompt_input.focus()

    async def action_new_chat(self) -> None:
        await self.open_conversation(Conversation.new(self.model))

    async def on_conversation_list_opened(self, event: ConversationList.Opened) -> None:
        if event.conv_id == self.conversation.id:
            return
        try:
            conv = self.store.load(event.conv_id)
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.notify(f"Could not open that conversation: {e}", severity="error")
            return
        await self.open_conversation(conv)

    def action_rename(self) -> None:
        conv = self.conversation

        async def done(title: str | None) -> None:
            if title:
                conv.title = title
                self.save_conversation(conv)
                await self.refresh_sidebar()

        self.push_screen(RenameScreen(conv.title), done)

    def action_delete(self) -> None:
        conv = self.conversation

        async def done(yes: bool | None) -> None:
            if yes:
                if conv is self.conversation:
                    await self.stop_reply()
                self.store.delete(conv.id)
                conv.messages.clear()  # nothing left to save for it
                await self.open_conversation(Conversation.new(self.model))

        self.push_screen(ConfirmScreen(f"Delete the conversation “{conv.title}”?", yes="Delete"), done)

    def action_settings(self) -> None:
        def done(result: SettingsResult | None) -> None:
            if result is None:
                return
            self.settings = result.settings
            self.settings_store.save(self.settings, result.model)
            if result.model != self.model or self.backend is None:
                self.load_model(result.model)
            self.update_status()

        self.push_screen(SettingsScreen(self.settings, self.model, self.current_model_options()), done)

    async def _ask_to_drop(self, conv: Conversation) -> bool:
        """True when the conversation fits (possibly after the user agreed to drop old turns)."""
        if self.backend is None or self.info is None or self.info.n_ctx is None:
            return True
        check = check_context(conv.messages, self.settings, self.info.n_ctx, self.backend.count_tokens)
        if check is None or check.fits:
            return True
        if check.impossible:
            await self.chat.add_notice(
                f"The last message is too long: with {check.reserve} tokens kept for the reply it does not "
                f"fit the context window of {check.n_ctx} tokens. Shorten it (Ctrl+L edits it) or lower "
                "max tokens in Settings."
            )
            return False
        question = (
            f"This conversation takes {check.used} tokens; with {check.reserve} tokens kept for the reply it "
            f"no longer fits the context window of {check.n_ctx} tokens.\n\nDrop the {check.drop} oldest "
            "messages from what the model sees? They stay saved and visible, dimmed."
        )
        self.reply_waiting = True
        try:
            agreed = await self.push_screen_wait(ConfirmScreen(question, yes="Drop oldest", no="Cancel"))
        finally:
            self.reply_waiting = False
        if not agreed:
            await self.chat.add_notice(
                "Not sent: the conversation is longer than the context window. Start a new chat (Ctrl+N), "
                "or press Ctrl+R to be asked again."
            )
            return False
        drop_oldest(conv.messages, check.drop)
        for view in self.chat.message_views():
            view.refresh_header()
        self.save_conversation(conv)
        return True
