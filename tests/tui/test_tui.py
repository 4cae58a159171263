"""The chat TUI driven headless with Textual's pilot: a scripted backend for the UI behaviour, the real
default model for streaming and stopping (conversations and settings: test_tui_conversations.py; the remote
backend: test_tui_remote.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from textual.widgets.markdown import MarkdownBlock

from edgellm.testing.limits import HANG_S
from tests.scripted_backend import ScriptedBackend
from tests.tui.pilot import MODELS, SIZE, header, make_app, ready, saved, send, status_text, wait_for
from tui.app import ChatApp
from tui.messages import BackendError, ChatMessage, GenerationSettings
from tui.screens import ConfirmScreen
from tui.storage import ConversationStore
from tui.widgets import (
    ConversationView,
    LoadingPanel,
    MessageBody,
    MessageView,
    PromptInput,
)


@pytest.mark.asyncio
async def test_send_streams_reply_saves_and_counts_context(tmp_path: Path) -> None:
    app, backends = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hello there")
        conv = app.conversation
        assert [(m.role, m.content) for m in conv.messages] == [
            ("user", "hello there"),
            ("assistant", "You said: **hello there**"),
        ]
        assert backends[0].requests[0][0] == [ChatMessage("user", "hello there")]
        assert conv.title == "hello there"
        # the context count is the backend's count of what the next request would send
        used = backends[0].count_tokens(app.prompt_messages())
        assert f"ctx {used}/4096" in status_text(app) and "100.0 tok/s" in status_text(app)
        assert app.prompt_input.text == ""
    [data] = saved(tmp_path)
    assert [m["content"] for m in data["messages"]] == ["hello there", "You said: **hello there**"]
    assert data["messages"][1]["partial"] is False


@pytest.mark.asyncio
async def test_newline_key_inserts_a_line_instead_of_sending(tmp_path: Path) -> None:
    app, backends = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one(PromptInput).text == "a\nb"
        assert app.conversation.messages == []
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2 and not app.replying)
        assert app.conversation.messages[0].content == "a\nb"


@pytest.mark.asyncio
async def test_escape_stops_the_reply_and_keeps_the_partial_text(tmp_path: Path) -> None:
    long_reply = " ".join(f"word{i}" for i in range(400))
    app, backends = make_app(tmp_path, reply_for=lambda m: long_reply, delay=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2
                       and len(app.conversation.messages[1].content) > 30)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.replying)
        reply = app.conversation.messages[1]
        assert reply.partial and 30 < len(reply.content) < len(long_reply)
        assert long_reply.startswith(reply.content)
        assert backends[0].aborted == 1
        assert "stopped" in str(app.query(MessageView).last().query_one(".message-header").render())
        kept = reply.content
    [data] = saved(tmp_path)
    assert data["messages"][1]["content"] == kept and data["messages"][1]["partial"] is True


@pytest.mark.asyncio
async def test_view_follows_a_long_reply_unless_the_user_scrolls_up(tmp_path: Path) -> None:
    """A conversation shorter than the view sits at its top; a reply that overflows it is followed to its
    end as it streams; a user who scrolls up mid-reply stays where they scrolled. The reply's paragraphs
    keep a blank line between them and none after the last."""
    paragraphs = "\n\n".join(" ".join(f"p{p}w{i}" for i in range(30)) for p in range(12))
    app, _ = make_app(tmp_path, reply_for=lambda m: "short" if m[-1].content == "hi" else paragraphs,
                      delay=0.002)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        chat = app.query_one(ConversationView)
        await pilot.pause()
        # at the top (below its one-line margin), not pushed to the bottom of the view
        assert chat.max_scroll_y == 0 and app.query(MessageView).first().region.y == chat.region.y + 1
        await send(pilot, "long")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y)
        assert chat.max_scroll_y > 0
        blocks = app.query(MessageView).last().query_one(MessageBody).query(MarkdownBlock)
        assert [b.styles.margin.bottom for b in blocks] == [1] * (len(blocks) - 1) + [0]

        await pilot.press(*"again", "enter")
        await wait_for(pilot, lambda: len(app.conversation.messages[-1].content) > 200)
        await pilot.pause()
        chat.scroll_home(animate=False)
        await wait_for(pilot, lambda: not app.replying)
        await pilot.pause()
        assert chat.scroll_y == 0 < chat.max_scroll_y


@pytest.mark.asyncio
async def test_streaming_reply_is_labelled_stopped_only_after_escape(tmp_path: Path) -> None:
    long_reply = " ".join(f"word{i}" for i in range(400))
    app, _ = make_app(tmp_path, reply_for=lambda m: "short answer" if m[-1].content == "hi" else long_reply,
                      delay=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: len(app.query(MessageView)) == 2)
        streaming = app.query(MessageView).last()
        assert "stopped" not in header(streaming)  # from its first frame on
        await wait_for(pilot, lambda: len(app.conversation.messages[1].content) > 30)
        assert app.replying and "stopped" not in header(streaming)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.replying)
        assert header(streaming).endswith(" · stopped")
        await send(pilot, "hi")
        assert "stopped" not in header(app.query(MessageView).last())  # finished normally


class TemplateBackend(ScriptedBackend):
    """Counts like a real chat template: an empty conversation cannot be rendered."""

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int | None:
        if not messages:
            raise BackendError("The model's chat template rejected the conversation: messages must not be "
                               "empty")
        return super().count_tokens(messages)


@pytest.mark.asyncio
async def test_status_turns_ready_on_a_new_chat_the_template_cannot_count(tmp_path: Path) -> None:
    app = ChatApp(TemplateBackend, "scripted", store=ConversationStore(tmp_path), model_options=MODELS)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "ready" in status_text(app))
        assert "ctx 0/4096" in status_text(app) and not app.query_one(LoadingPanel).display
        await send(pilot, "hello")
        assert "ready" in status_text(app) and "ctx 15/4096" in status_text(app)  # 3 + (4+1) + (4+3)
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: "ctx 0/4096" in status_text(app))


@pytest.mark.asyncio
async def test_loading_panel_shown_from_the_first_frame_and_fed_from_any_thread(tmp_path: Path) -> None:
    gate = asyncio.Event()
    app, _ = make_app(tmp_path, load_gate=gate, load_lines=())
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(LoadingPanel)
        assert panel.display and app.state == "loading" and "loading" in status_text(app)
        assert str(panel.query_one("#loading-title").render()) == "Loading scripted..."
        thread = threading.Thread(target=panel.add_line, args=("compiling kernels (from a thread)",))
        thread.start()
        thread.join()
        log = panel.query_one("#loading-log")
        await wait_for(pilot, lambda: "compiling kernels (from a thread)" in str(log.render()))
        gate.set()
        await ready(pilot)


@pytest.mark.asyncio
async def test_regenerate_edit_and_copy(tmp_path: Path) -> None:
    calls = {"n": 0}

    def numbered(messages: Sequence[ChatMessage]) -> str:
        calls["n"] += 1
        return f"reply {calls['n']} to {messages[-1].content}"

    app, backends = make_app(tmp_path, reply_for=numbered)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: calls["n"] == 2 and not app.replying)
        assert [m.content for m in app.conversation.messages] == ["first", "reply 2 to first"]
        assert len(app.query(MessageView)) == 2

        await pilot.press("ctrl+o")
        assert app.clipboard == "reply 2 to first"
        app.query(MessageView).first().focus()
        await pilot.press("c")
        assert app.clipboard == "first"

        app.prompt_input.focus()
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: app.prompt_input.text == "first")  # set once the views are removed
        assert app.prompt_input.text == "first" and app.conversation.messages == []
        await pilot.press("!", "enter")
        await wait_for(pilot, lambda: calls["n"] == 3 and not app.replying)
        assert [m.content for m in app.conversation.messages] == ["first!", "reply 3 to first!"]
        assert backends[0].requests[-1][0] == [ChatMessage("user", "first!")]
    [data] = saved(tmp_path)
    assert [m["content"] for m in data["messages"]] == ["first!", "reply 3 to first!"]


@pytest.mark.asyncio
async def test_regenerate_and_edit_drop_the_notices_of_the_reply_they_replace(tmp_path: Path) -> None:
    """A reply cut at its length limit gets a notice below it; Ctrl+R replaces the reply and the notice
    goes with it (the new reply, within its limit, has none); Ctrl+L likewise."""
    app, _ = make_app(tmp_path, reply_for=lambda m: "one two three four five six")

    def notices() -> list[str]:
        return [str(w.render()) for w in app.chat.children if w.has_class("notice")]

    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.settings = GenerationSettings(max_tokens=3)
        await send(pilot, "count")
        await wait_for(pilot, lambda: len(notices()) == 1)
        assert "length limit (3 tokens)" in notices()[0]
        assert app.chat.children[-1].has_class("notice")  # below the reply it is about
        app.settings = GenerationSettings(max_tokens=64)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.replying and app.conversation.messages[-1].role == "assistant")
        await pilot.pause()
        assert app.conversation.messages[-1].content == "one two three four five six"
        assert notices() == []
        app.settings = GenerationSettings(max_tokens=3)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(notices()) == 1 and not app.replying)
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: app.prompt_input.text == "count")
        assert notices() == [] and len(app.chat.children) == 0


@pytest.mark.asyncio
async def test_loading_progress_then_load_error_shown_in_app(tmp_path: Path) -> None:
    gate = asyncio.Event()
    app, _ = make_app(tmp_path, load_gate=gate, load_error="Model not found: no model named 'x'")
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(LoadingPanel)
        await wait_for(pilot, lambda: len(panel.lines) == 2)
        assert panel.display and app.state == "loading"
        assert panel.lines == ["loading scripted model", "compiling kernels (1/1)"]
        assert "ctx ?/?" in status_text(app) and "loading" in status_text(app)
        gate.set()
        await wait_for(pilot, lambda: app.state == "error")
        assert panel.display and "Model not found: no model named 'x'" in panel.lines
        await pilot.press(*"hi", "enter")  # no model: a notice, not a crash
        await pilot.pause()
        assert app.conversation.messages == [] and app.is_running


@pytest.mark.asyncio
async def test_reply_error_is_a_readable_notice(tmp_path: Path) -> None:
    def failing(messages: Sequence[ChatMessage]) -> str:
        raise BackendError("Out of memory while generating the reply.")

    app, _ = make_app(tmp_path, reply_for=failing)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: app.state == "error")
        notice = app.query(".notice").last()
        assert str(notice.render()) == "Error: Out of memory while generating the reply."
        assert [m.role for m in app.conversation.messages] == ["user"]  # no empty reply bubble


@pytest.mark.asyncio
async def test_context_overflow_asks_before_dropping_oldest_turns(tmp_path: Path) -> None:
    words = " ".join(["w"] * 12)
    app, backends = make_app(tmp_path, n_ctx=64, reply_for=lambda m: words)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.settings.max_tokens = 16  # reply reserve: min(16, 80 // 4) = 16 tokens
        await send(pilot, "one")
        await send(pilot, "two")  # 2 turns: 3 + (4+1 + 4+12) * 2 = 45 tokens, fits 80 - 16
        await pilot.press(*"three", "enter")  # would take 66 tokens: 66 + 16 > 80
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "no longer fits the context window of 64 tokens" in app.screen.question
        await pilot.click("#no")
        await wait_for(pilot, lambda: not app.replying)
        assert len(backends[0].requests) == 2  # nothing sent, nothing dropped
        assert all(m.in_context for m in app.conversation.messages)
        assert "Not sent" in str(app.query(".notice").last().render())

        await pilot.press("ctrl+r")  # asked again; this time drop
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#yes")
        await wait_for(pilot, lambda: len(backends[0].requests) == 3 and not app.replying)
        sent = backends[0].requests[-1][0]
        assert [m.content for m in sent] == ["two", words, "three"]
        assert [m.in_context for m in app.conversation.messages] == [False, False, True, True, True, True]
        assert app.query(MessageView).first().has_class("dropped")
    data = saved(tmp_path)[0]
    assert [m["in_context"] for m in data["messages"]] == [False, False, True, True, True, True]


@pytest.mark.asyncio
async def test_closing_mid_reply_keeps_what_streamed(tmp_path: Path) -> None:
    long_reply = " ".join(f"w{i}" for i in range(500))
    app, _ = make_app(tmp_path, reply_for=lambda m: long_reply, delay=0.01)
    app.save_interval = 3600  # only the save on exit can keep the text
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2
                       and len(app.conversation.messages[1].content) > 20)
        await app.action_quit()
    reply = saved(tmp_path)[0]["messages"][1]
    assert len(reply["content"]) > 20 and long_reply.startswith(reply["content"]) and reply["partial"]


# ---- the real default model ------------------------------------------------------------------------
def test_real_model_streams_greedy_reply_and_stops(tmp_path: Path, smollm2_path: Path) -> None:
    from edgellm import SamplingParams
    from tui.local_backend import LocalBackend
    from tui.prompt import render_prompt_ids

    backends: list[LocalBackend] = []

    def factory(model: str) -> LocalBackend:
        backends.append(LocalBackend(model, stream_interval=0.0))  # a message per engine step
        return backends[-1]

    app = ChatApp(factory, str(smollm2_path), store=ConversationStore(tmp_path), model_options=[])
    app.settings = GenerationSettings(temperature=0.0, max_tokens=24)
    app.draw_interval = app.draw_cpu_share = 0  # every delta drawn as it comes: the pieces are the stream
    pieces: list[str] = []

    async def drive() -> None:
        async with app.run_test(size=SIZE) as pilot:
            panel = app.query_one(LoadingPanel)
            await wait_for(pilot, lambda: app.state != "loading", timeout=HANG_S)
            assert app.state == "ready" and not panel.display, panel.lines
            assert any("repacked weights" in line for line in panel.lines)
            original = MessageView.append

            async def spy(view: MessageView, text: str) -> None:
                pieces.append(text)
                await original(view, text)

            MessageView.append = spy  # type: ignore[method-assign]
            try:
                await pilot.press(*"What is the capital of France?", "enter")
                # a bound, not a speed check: the machine running the tests may be busy
                replied = lambda: not app.replying and app.conversation.messages[-1].role != "user"  # noqa: E731
                await wait_for(pilot, replied, timeout=HANG_S)
            finally:
                MessageView.append = original  # type: ignore[method-assign]
            reply = app.conversation.messages[-1]
            assert reply.role == "assistant" and not reply.partial and reply.tokens_per_s
            used = len(render_prompt_ids(backends[0].llm, app.prompt_messages()))
            assert f"ctx {used}/{backends[0].llm.n_ctx}" in status_text(app)

            app.settings = GenerationSettings(temperature=0.0, max_tokens=300)
            await pilot.press(*"Tell me a long story about a dragon.", "enter")
            await wait_for(pilot, lambda: len(app.conversation.messages) == 4
                           and len(app.conversation.messages[3].content) > 20, timeout=HANG_S)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.replying)
            await wait_for(pilot, lambda: backends[0].llm.stats().num_running == 0, timeout=HANG_S)
            stopped = app.conversation.messages[3]
            assert stopped.partial and stopped.content
            llm = backends[0].llm
            messages = [ChatMessage("user", "What is the capital of France?")]
            params = SamplingParams(temperature=0.0, max_tokens=24)
            refs.extend(await llm.agenerate([render_prompt_ids(llm, messages)], params))

    refs: list = []
    asyncio.run(drive())
    [ref] = refs
    assert backends[0].llm is None  # closing the app shut the engine core down
    convs = ConversationStore(tmp_path).list()
    assert convs[0].messages[1].content == ref.text  # what streamed into the app is the greedy completion
    assert len(pieces) > 3 and "".join(pieces) == ref.text  # and it came in pieces
    assert convs[0].messages[3].partial and convs[0].messages[3].content


@pytest.mark.asyncio
async def test_local_backend_missing_model_is_a_readable_error() -> None:
    from tui.local_backend import LocalBackend

    lines: list[str] = []
    with pytest.raises(BackendError, match="^Model not found: no model named 'no-such-model'"):
        await LocalBackend("no-such-model").load(lines.append)
    assert lines == ["loading no-such-model..."]


@pytest.mark.asyncio
async def test_unsaved_settings_start_at_the_models_recommended_sampling(tmp_path: Path) -> None:
    """A model whose GGUF recommends a temperature and top-p (general.sampling.*) is sampled so until the
    user saves settings of their own; saved settings win."""
    from tui.storage import SettingsStore

    made: list[ScriptedBackend] = []

    def factory(model: str) -> ScriptedBackend:
        made.append(ScriptedBackend(model, recommended={"temperature": 0.3, "top_p": 0.8, "top_k": 20}))
        return made[-1]

    for own in (None, GenerationSettings(temperature=1.1, top_p=0.5)):
        settings = SettingsStore(tmp_path / ("saved" if own else "fresh"))
        if own is not None:
            settings.save(own, "scripted")
        chats = ConversationStore(tmp_path / "chats")
        app = ChatApp(factory, "scripted", store=chats, settings_store=settings, model_options=MODELS)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, "hi")
        _, used = made[-1].requests[-1]
        assert (used.temperature, used.top_p) == ((0.3, 0.8) if own is None else (1.1, 0.5))
