"""The main screen's pieces: message bubbles rendered as Markdown, the conversation view, the prompt box,
the sidebar list of conversations, the loading panel and the status bar."""

from __future__ import annotations

import threading

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Label, LoadingIndicator, Markdown, OptionList, Static, TextArea
from textual.widgets.markdown import MarkdownBlock
from textual.widgets.option_list import Option

from tui.storage import Conversation, StoredMessage

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")  # terminals send ctrl+j for Ctrl+Enter / Ctrl+J


class MessageBody(Markdown):
    """A message's Markdown. Its last block has no blank line below it: a class set once the text is
    drawn, where a `:last-child` CSS rule would restyle every block of the message each time a streaming
    reply mounts a new one (the dearest part of a frame of a long reply)."""

    def mark_last_block(self) -> None:
        blocks = [c for c in self.children if isinstance(c, MarkdownBlock)]
        for block in blocks[:-1]:
            block.remove_class("last-block")
        if blocks:
            blocks[-1].add_class("last-block")

    def on_markdown_table_of_contents_updated(self, event: Markdown.TableOfContentsUpdated) -> None:
        # posted when update() has mounted the blocks (append() posts nothing: see end_stream)
        self.mark_last_block()


class MessageView(Vertical, can_focus=True):
    """One message: a header line (who, speed, state) over its Markdown body. Focus it and press c to
    copy it. `streaming`: a reply still being generated; it is drawn so from its first frame, since a
    reply is partial until it finishes and a partial reply that is not streaming was stopped."""

    BINDINGS = [Binding("c", "copy", "Copy message")]

    def __init__(self, message: StoredMessage, streaming: bool = False) -> None:
        super().__init__(classes=f"message {message.role}")
        self.message = message
        self.streaming = streaming
        self.drawn = message.content  # what the body has finished drawing (append can be interrupted)

    def compose(self) -> ComposeResult:
        yield Static(self.header_text(), classes="message-header")
        if self.message.reasoning:
            yield _reasoning_fold(self.message.reasoning)
        yield MessageBody(self.message.content, classes="message-body")

    async def show_reasoning(self) -> None:
        """Draw the reasoning so far in its fold above the answer (mounted with the first of it)."""
        folds = self.query(".reasoning")
        if folds:
            folds.first().query_one(".reasoning-text", Static).update(self.message.reasoning)
        elif self.message.reasoning:
            await self.mount(_reasoning_fold(self.message.reasoning), before=self.query_one(MessageBody))

    def header_text(self) -> str:
        m = self.message
        parts = ["You" if m.role == "user" else "Assistant"]
        if m.ttft is not None:
            parts.append(f"TTFT {m.ttft:.2f} s")
        if m.tokens_per_s is not None:
            parts.append(f"{m.tokens_per_s:.1f} tok/s")
        if m.partial and not self.streaming:
            parts.append("stopped" if m.content else "stopped before its first token")
        if not m.in_context:
            parts.append("outside the context window")
        return " · ".join(parts)

    def refresh_header(self) -> None:
        self.query_one(".message-header", Static).update(self.header_text())
        self.set_class(not self.message.in_context, "dropped")

    def on_mount(self) -> None:
        self.set_class(not self.message.in_context, "dropped")

    def start_stream(self) -> None:
        if not self.streaming:
            self.streaming = True
            self.refresh_header()

    async def append(self, text: str) -> None:
        """Add a piece of the streaming reply: Markdown re-parses from its last block only."""
        await self.query_one(MessageBody).append(text)
        self.drawn += text

    async def end_stream(self) -> None:
        """Draw the whole reply. Also what an interrupted append left out: Markdown.append takes the text
        as its source before it mounts the blocks that show it, so the body's source is no proof."""
        body = self.query_one(MessageBody)
        if self.drawn != self.message.content:
            await body.update(self.message.content)
            self.drawn = self.message.content
        body.mark_last_block()
        self.streaming = False
        self.refresh_header()

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.message.content)
        self.app.notify("Message copied to the clipboard", timeout=2)


def _reasoning_fold(text: str) -> Collapsible:
    """A thinking model's reasoning: dimmed, folded away until opened."""
    body = Static(text, classes="reasoning-text", markup=False)
    return Collapsible(body, title="Reasoning", collapsed=True, classes="reasoning")


class ConversationView(VerticalScroll):
    """The messages of the open conversation, newest at the bottom, following the stream."""

    async def show(self, conv: Conversation) -> None:
        self.anchor(False)
        await self.remove_children()
        await self.mount_all([MessageView(m) for m in conv.messages])
        self._to_end()

    async def add(self, message: StoredMessage, streaming: bool = False) -> MessageView:
        view = MessageView(message, streaming)
        await self.mount(view)
        self._to_end()
        return view

    def _to_end(self) -> None:
        """Scroll to what was just mounted, and follow from there once the view overflows."""
        self.scroll_end(animate=False)
        self.call_after_refresh(self.follow)

    def follow(self) -> None:
        """Keep the end in view as messages come and a reply grows, once the messages overflow the view:
        anchored, Textual scrolls to the end within each layout pass (no scroll request per frame), until
        the user scrolls up to read. Not before: an anchored view shorter than its content area would draw
        its messages at the bottom."""
        if not self.is_anchored and self.max_scroll_y > 0:
            self.anchor()

    def message_views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    async def remove_notices_after(self, view: MessageView) -> None:
        """Remove the notices below `view` (they were about the turns after it)."""
        below = self.children[self.children.index(view) + 1 :]
        notices = [w for w in below if w.has_class("notice")]
        if notices:
            await self.remove_children(notices)

    async def add_notice(self, text: str, kind: str = "error") -> None:
        await self.mount(Static(text, classes=f"notice {kind}", markup=False))
        self._to_end()


class PromptInput(TextArea):
    """The message box: Enter sends, Ctrl+J (or Shift+Enter / Alt+Enter where the terminal reports them)
    starts a new line."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class ConversationList(OptionList):
    """The sidebar: saved conversations, most recent first. One widget that draws its own lines (not a
    widget per conversation): every layout pass of the screen visits every widget, and with a hundred
    saved conversations a widget each made each streamed frame ~2.5x dearer."""

    class Opened(Message):
        def __init__(self, conv_id: str) -> None:
            super().__init__()
            self.conv_id = conv_id

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, **kwargs)

    async def show(self, convs: list[Conversation], current: str | None) -> None:
        self.clear_options()
        self.add_options(Option(c.title, id=c.id) for c in convs)
        ids = [c.id for c in convs]
        self.highlighted = ids.index(current) if current in ids else None

    def titles(self) -> list[str]:
        return [str(self.get_option_at_index(i).prompt) for i in range(self.option_count)]

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(self.Opened(event.option.id))


class LoadingPanel(Vertical):
    """Shown while a model loads: a spinner and the progress lines (download, repack, kernel compile).
    `add_line` may be called from any thread (a backend's load thread reports progress as it goes)."""

    class Line(Message):
        def __init__(self, line: str) -> None:
            super().__init__()
            self.line = line

    def __init__(self, title: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.heading = title
        self.lines: list[str] = []
        self._app_thread = threading.get_ident()  # widgets are built, and may only change, on this one

    def compose(self) -> ComposeResult:
        yield Label(self.heading, id="loading-title")
        yield LoadingIndicator()
        yield Static("", id="loading-log", markup=False)

    def set_title(self, text: str) -> None:
        self.heading = text
        self.query_one("#loading-title", Label).update(text)

    def add_line(self, line: str) -> None:
        if threading.get_ident() != self._app_thread:
            self.post_message(self.Line(line))  # thread-safe; handled below on the app's thread
            return
        self.lines.append(line)
        # the latest lines are what matters; markup off: paths and messages may hold brackets
        self.query_one("#loading-log", Static).update("\n".join(self.lines[-8:]))

    def on_loading_panel_line(self, event: LoadingPanel.Line) -> None:
        event.stop()
        self.add_line(event.line)


class StatusBar(Static):
    """model · context used/size · last reply's time to first token and speed · [speculation] · state."""

    def show(
        self,
        model: str,
        ctx_used: int | None,
        n_ctx: int | None,
        ttft: float | None,
        tps: float | None,
        state: str,
        approx: bool = False,
        spec: tuple[float, float] | None = None,
    ) -> None:
        """spec: speculative decoding's (acceptance rate, mean tokens per verify step), when it is on."""
        used = "?" if ctx_used is None else f"{'~' if approx else ''}{ctx_used}"
        parts = [model or "no model", f"ctx {used}/{n_ctx or '?'}"]
        parts.append(f"TTFT {ttft:.2f} s" if ttft is not None else "TTFT -")
        parts.append(f"{tps:.1f} tok/s" if tps is not None else "- tok/s")
        if spec is not None:
            parts.append(f"spec {spec[0]:.0%} accepted, {spec[1]:.1f} tok/step")
        parts.append(state)
        self.update(" │ ".join(parts))
