"""Shared fixtures: the two real models of the catalog, resolved (and fetched on first use) by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm.catalog import resolve_model

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return resolve_model("gemma3-270m")


@pytest.fixture(autouse=True)
def _ui_keeps_its_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat app run in the test process would lower the whole test process's priority for good
    (tui.local_backend.yield_cpu_to_engine) and slow the pilot's own key presses; tests that check the
    priority itself run it in a child process (tests/test_tui_priority.py, the tmux test)."""
    import tui.local_backend

    monkeypatch.setattr(tui.local_backend, "yield_cpu_to_engine", lambda: None)
