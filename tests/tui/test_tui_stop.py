"""Esc stops a reply at any moment and the reply keeps what came, drawn and labelled "stopped": a backend
the test pauses at an exact point of the stream (before the first token, with tokens received but not yet
drawn, after the last token, after the end) and a frame the test holds half drawn make each moment
deterministic, however fast or slow the host."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from textual.widgets.markdown import MarkdownBlock

from tests.scripted_backend import ScriptedBackend
from tests.tui.pilot import header, wait_for
from tui.app import ChatApp
from tui.messages import ChatMessage, GenerationSettings, StreamDelta, StreamDone, StreamEvent
from tui.storage import ConversationStore
from tui.widgets import MessageBody, MessageView, PromptInput

SIZE = (100, 30)
PIECES = [f"word{i} " for i in range(8)]


class PausingBackend(ScriptedBackend):
    """Streams PIECES, then StreamDone; before yielding the piece at `pause_at` (len(PIECES): before the
    StreamDone, len(PIECES) + 1: after it, before the stream ends) it sets `paused` and waits for `resume`.
    A stream left early counts in `aborted`, as a real backend frees its request."""

    def __init__(self, pause_at: int) -> None:
        super().__init__("pausing")
        self.pause_at = pause_at
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def _pause(self, i: int) -> None:
        if i == self.pause_at:
            self.paused.set()
            await self.resume.wait()

    async def stream(
        self, messages: Sequence[ChatMessage], settings: GenerationSettings
    ) -> AsyncIterator[StreamEvent]:
        self.requests.append((list(messages), settings))
        finished = False
        try:
            for i, piece in enumerate(PIECES):
                await self._pause(i)
                yield StreamDelta(piece, ttft=0.05, tokens_per_s=50.0)  # the figures so far
            await self._pause(len(PIECES))
            yield StreamDone("stop", 0.05, 100.0, len(PIECES), 10)
            finished = True
            await self._pause(len(PIECES) + 1)
        finally:
            if not finished:
                self.aborted += 1


def make_app(tmp_path: Path, pause_at: int) -> tuple[ChatApp, PausingBackend]:
    backend = PausingBackend(pause_at)
    app = ChatApp(lambda model: backend, "pausing", store=ConversationStore(tmp_path), model_options=[])
    return app, backend


def drawn_text(view: MessageView) -> str:
    """The reply's text as its Markdown blocks draw it (words only: Markdown drops trailing spaces)."""
    blocks = view.query_one(MessageBody).query(MarkdownBlock)
    return " ".join(str(b.render()) for b in blocks).strip()


def words(text: str) -> list[str]:
    return text.split()


async def start(pilot, app: ChatApp) -> None:
    await wait_for(pilot, lambda: app.state == "ready")
    await pilot.press(*"go", "enter")


async def settled_reply(pilot, app: ChatApp, tmp_path: Path) -> MessageView:
    """Wait for the reply to settle after Esc; it is the last message, saved as shown."""
    await wait_for(pilot, lambda: not app.replying)
    await pilot.pause()
    assert app.state == "ready"
    assert [m.role for m in app.conversation.messages] == ["user", "assistant"]
    saved = ConversationStore(tmp_path).load(app.conversation.id).messages[-1]
    reply = app.conversation.messages[-1]
    assert (saved.content, saved.partial) == (reply.content, reply.partial)
    return app.query(MessageView).last()


@pytest.mark.asyncio
@pytest.mark.parametrize("pause_at", [0, 1, 5, len(PIECES), len(PIECES) + 1], ids=lambda n: f"after{n}pieces")
async def test_escape_keeps_every_piece_that_came_drawn_and_labelled(tmp_path: Path, pause_at: int) -> None:
    """0: before the first token (the bubble stays, labelled, rather than vanishing); 1: right after the
    first frame; 5: with 4 pieces received but not drawn yet (the frame budget holds them); len: after the
    last piece; len + 1: after the end (the reply finished: whole, not labelled stopped). A stopped reply
    keeps the speed it streamed at."""
    finished = pause_at > len(PIECES)
    app, backend = make_app(tmp_path, pause_at)
    async with app.run_test(size=SIZE) as pilot:
        app.draw_interval = 3600.0  # after the first frame nothing is drawn until the reply ends
        await start(pilot, app)
        await wait_for(pilot, lambda: backend.paused.is_set())
        await pilot.pause()
        await pilot.press("escape")
        view = await settled_reply(pilot, app, tmp_path)
        reply = app.conversation.messages[-1]
        assert reply.partial is not finished and reply.content == "".join(PIECES[:pause_at])
        assert words(drawn_text(view)) == words(reply.content)
        assert ("stopped" in header(view)) is not finished and not view.streaming
        # a reply's figures: StreamDone's when it finished, else the last piece's; none before the first
        speed = "TTFT 0.05 s · 100.0 tok/s" if finished else "TTFT 0.05 s · 50.0 tok/s"
        assert (speed in header(view)) == (pause_at > 0), header(view)
        assert pause_at > 0 or "tok/s" not in header(view)
        assert backend.aborted == (0 if finished else 1)
        await pilot.press(*"again", "enter")  # the chat goes on after a stop
        await wait_for(pilot, lambda: len(backend.requests) == 2)
        assert [m.role for m in backend.requests[1][0]] == ["user", "assistant", "user"]


@pytest.mark.asyncio
async def test_escape_while_a_frame_is_being_drawn_keeps_that_frame(tmp_path: Path, monkeypatch) -> None:
    """Esc lands while the first frame's Markdown blocks are being mounted (the test holds the mount):
    that frame's text must still end up on screen, not only in the saved message."""
    app, backend = make_app(tmp_path, 1)
    drawing, finish_drawing = asyncio.Event(), asyncio.Event()
    mount_all = MessageBody.mount_all

    async def held_mount_all(self, widgets, *args, **kwargs):
        widgets = list(widgets)
        reply = isinstance(self.parent, MessageView) and self.parent.message.role == "assistant"
        if widgets and reply and not finish_drawing.is_set():
            drawing.set()
            await finish_drawing.wait()
        await mount_all(self, widgets, *args, **kwargs)

    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(MessageBody, "mount_all", held_mount_all)
        await start(pilot, app)
        await wait_for(pilot, lambda: drawing.is_set())
        stop = asyncio.ensure_future(app.action_stop())  # the Esc key's action, pressed now
        await pilot.pause()
        finish_drawing.set()
        await stop
        view = await settled_reply(pilot, app, tmp_path)
        reply = app.conversation.messages[-1]
        assert reply.partial and reply.content == PIECES[0]
        assert words(drawn_text(view)) == words(PIECES[0])
        assert "stopped" in header(view)
        assert backend.aborted == 1  # the stream left after the frame: the backend frees the request


@pytest.mark.asyncio
async def test_escape_right_after_enter_stops_the_reply_before_it_starts(tmp_path: Path) -> None:
    """Enter and Esc handled in one go (typed ahead, or pasted): the reply the Enter asked for is stopped,
    not left to stream to its end."""
    app, backend = make_app(tmp_path, len(PIECES) + 1)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state == "ready")
        await app.on_prompt_input_submitted(PromptInput.Submitted("go"))  # starts the reply
        await app.action_stop()  # before the reply's worker had a turn
        view = await settled_reply(pilot, app, tmp_path)
        reply = app.conversation.messages[-1]
        assert reply.partial and reply.content == ""
        assert "stopped" in header(view)
        assert not backend.paused.is_set()
