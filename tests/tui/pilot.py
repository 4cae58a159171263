"""Driving the chat app under Textual's pilot: the app over scripted backends, waits bounded in time, and
reads of what the status bar, a message header and the saved conversations show (shared by the TUI tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.scripted_backend import ScriptedBackend
from tui.app import ChatApp
from tui.storage import ConversationStore
from tui.widgets import ConversationList, MessageView, StatusBar

SIZE = (100, 30)


MODELS = [("scripted", "scripted"), ("other", "other")]


def make_app(tmp_path: Path, **backend_kwargs) -> tuple[ChatApp, list[ScriptedBackend]]:
    made: list[ScriptedBackend] = []

    def factory(model: str) -> ScriptedBackend:
        made.append(ScriptedBackend(model, **backend_kwargs))
        return made[-1]

    app = ChatApp(factory, "scripted", store=ConversationStore(tmp_path), model_options=MODELS)
    return app, made


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Until `condition()` holds; `timeout` (60 s of 20 ms pauses, longer when the machine is busy) is a
    hang guard, not a speed check (edgellm/testing/limits.py)."""
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached in time")


async def ready(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.state in ("ready", "error"))


async def send(pilot, text: str) -> None:
    await pilot.press(*text)
    await pilot.press("enter")
    app = pilot.app
    await wait_for(pilot, lambda: not app.replying and app.conversation.messages[-1].role != "user")


def status_text(app: ChatApp) -> str:
    return str(app.query_one(StatusBar).render())


def header(view: MessageView) -> str:
    return str(view.query_one(".message-header").render())


def saved(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "conversations").glob("*.json"))]


async def click_conversation(pilot, conv_id: str) -> None:
    """Click a conversation's line in the sidebar (one line per conversation, no border)."""
    sidebar = pilot.app.query_one(ConversationList)
    await pilot.click(ConversationList, offset=(2, sidebar.get_option_index(conv_id)))
