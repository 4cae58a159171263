"""The chat TUI's conversations and settings, driven headless with Textual's pilot over a scripted backend:
switching, reopening after a restart, renaming and deleting conversations; the settings screen and the
settings read from the environment (the chat itself: test_tui.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tui.pilot import SIZE, click_conversation, make_app, ready, saved, send, status_text, wait_for
from tui.messages import ChatMessage, GenerationSettings
from tui.screens import ConfirmScreen, SettingsScreen
from tui.storage import SettingsStore
from tui.widgets import ConversationList, MessageView


@pytest.mark.asyncio
async def test_switch_conversations_then_reopen_after_restart(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "about cats")
        first_id = app.conversation.id
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.conversation.id != first_id)  # the views change after the id
        await wait_for(pilot, lambda: len(app.query(MessageView)) == 0)
        assert app.conversation.messages == []
        await send(pilot, "about dogs")
        assert app.conversation.id != first_id
        await click_conversation(pilot, first_id)
        await wait_for(pilot, lambda: app.conversation.id == first_id)
        assert [m.content for m in app.conversation.messages][0] == "about cats"
        first_view = lambda: app.query(MessageView).first().message  # noqa: E731 (the views follow the id)
        await wait_for(pilot, lambda: first_view() is app.conversation.messages[0])
        assert "about cats" in str(app.query(MessageView).first().query_one("Markdown")._markdown)

    app2, _ = make_app(tmp_path)  # a fresh start over the same data directory
    async with app2.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app2.conversation.messages == []
        assert app2.query_one(ConversationList).option_count == 2
        await click_conversation(pilot, first_id)
        await wait_for(pilot, lambda: app2.conversation.id == first_id)
        assert [m.content for m in app2.conversation.messages] == ["about cats", "You said: **about cats**"]
        await send(pilot, "more")  # the reopened conversation goes on, history included
        assert len(app2.conversation.messages) == 4


@pytest.mark.asyncio
async def test_rename_and_delete(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "to be renamed")
        await pilot.press("f2")
        await pilot.press("ctrl+a", "ctrl+k", *"Cats", "enter")
        await wait_for(pilot, lambda: app.conversation.title == "Cats")
        assert saved(tmp_path)[0]["title"] == "Cats"
        assert app.query_one(ConversationList).titles() == ["Cats"]
        await pilot.press("f8")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.click("#yes")
        # the conversation is emptied before the new one opens and the sidebar is redrawn: wait for all
        await wait_for(pilot, lambda: app.conversation.messages == []
                       and app.query_one(ConversationList).option_count == 0)
        assert saved(tmp_path) == [] and app.query_one(ConversationList).option_count == 0


@pytest.mark.asyncio
async def test_settings_change_sampling_system_prompt_and_model(tmp_path: Path) -> None:
    app, backends = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)
        screen = app.screen
        screen.query_one("#temperature").value = "0.2"
        screen.query_one("#seed").value = "7"
        screen.query_one("#max-tokens").value = "64"
        screen.query_one("#system-prompt").load_text("Be brief.")
        screen.query_one("#model").value = "other"
        await pilot.click("#save")
        await wait_for(pilot, lambda: app.model == "other" and app.state == "ready")
        assert [b.model for b in backends] == ["scripted", "other"] and backends[0].closed
        await send(pilot, "hi")
        messages, settings = backends[1].requests[-1]
        assert messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "hi")]
        assert (settings.temperature, settings.seed, settings.max_tokens) == (0.2, 7, 64)
        assert status_text(app).startswith("other │")
    stored, model = SettingsStore(tmp_path).load()
    assert stored == GenerationSettings("Be brief.", 0.2, 0.95, 64, 7) and model == "other"


@pytest.mark.asyncio
async def test_model_list_says_downloaded_once_the_model_is(tmp_path: Path, monkeypatch) -> None:
    """The Settings model list is built from the catalog each time it opens: a model fetched since (the
    first start's download, `edgellm pull` elsewhere) no longer says "(not downloaded)"."""
    from edgellm.models.catalog import CATALOG, local_path, models_dir
    from tests.scripted_backend import ScriptedBackend
    from tui.app import ChatApp
    from tui.storage import ConversationStore

    monkeypatch.setenv("EDGELLM_MODELS_DIR", str(tmp_path / "models"))
    name, entry = next(iter(CATALOG.items()))
    if local_path(entry) is not None:
        pytest.skip(f"{name} is installed as a package here: it never shows as missing")
    app = ChatApp(ScriptedBackend, "scripted", store=ConversationStore(tmp_path / "chats"))

    def label() -> str:
        return next(str(text) for text, value in app.screen.models if value == name)

    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen) and label().endswith("(not downloaded)")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        models_dir().mkdir(parents=True)
        (models_dir() / entry.file).write_bytes(b"GGUF")  # the download landed
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen) and "not downloaded" not in label()


@pytest.mark.asyncio
async def test_settings_reject_bad_values_with_a_message(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        app.screen.query_one("#temperature").value = "hot"
        await pilot.click("#save")
        assert isinstance(app.screen, SettingsScreen)
        assert "Temperature must be a number" in str(app.screen.query_one("#settings-error").render())
        await pilot.press("escape")
        assert not isinstance(app.screen, SettingsScreen) and app.settings == GenerationSettings()


def test_ui_settings_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.backend import env_number

    assert env_number("EDGELLM_TEST_SHARE", 0.1, 0.01, 1.0) == 0.1
    monkeypatch.setenv("EDGELLM_TEST_SHARE", "0.05")
    assert env_number("EDGELLM_TEST_SHARE", 0.1, 0.01, 1.0) == 0.05
    for bad in ("abc", "0", "2", "nan"):
        monkeypatch.setenv("EDGELLM_TEST_SHARE", bad)
        want = f"EDGELLM_TEST_SHARE must be a number in \\[0.01, 1\\], got '{bad}'"
        with pytest.raises(SystemExit, match=want):
            env_number("EDGELLM_TEST_SHARE", 0.1, 0.01, 1.0)
    monkeypatch.setenv("EDGELLM_TEST_NICENESS", "5")
    assert env_number("EDGELLM_TEST_NICENESS", 19, -20, 19, whole=True) == 5
    monkeypatch.setenv("EDGELLM_TEST_NICENESS", "5.5")  # a niceness is whole: never silently rounded to 5
    want = "EDGELLM_TEST_NICENESS must be a whole number in \\[-20, 19\\], got '5.5'"
    with pytest.raises(SystemExit, match=want):
        env_number("EDGELLM_TEST_NICENESS", 19, -20, 19, whole=True)
