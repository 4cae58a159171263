"""Shared fixtures: the two real models of the catalog, resolved (and fetched on first use) by name."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

# Every CPU tier the host can run compiled into the kernels, before anything imports them: the kernel
# tests run each tier in this one process (edgellm/backends/cpu/tiers.py). Child processes inherit it
# and so share the same cached kernels.
os.environ.setdefault("EDGELLM_CPU_ALL_TIERS", "1")

import pytest

from edgellm.models.catalog import resolve_model
from edgellm.testing.limits import warm_kernels
from edgellm.testing.paths import FIXTURES  # noqa: F401  (tests and their helpers read it from here too)


def _warmed(config: pytest.Config, name: str) -> Path:
    """The catalog model `name`, fetched on first use, with its kernels compiled (or loaded from the disk
    cache) once for the session, its progress on the terminal: a cold compile is minutes, and no test's
    own limit pays it (edgellm/testing/limits.py)."""
    path = resolve_model(name)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(line: str) -> None:
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line(f"edgellm tests: {line}")

    warm_kernels(path, say)
    return path


@pytest.fixture(scope="session")
def smollm2_path(pytestconfig: pytest.Config) -> Path:
    return _warmed(pytestconfig, "smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path(pytestconfig: pytest.Config) -> Path:
    return _warmed(pytestconfig, "gemma3-270m")


@pytest.fixture(autouse=True)
def _ui_keeps_its_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat app run in the test process would lower the whole test process's priority for good
    (tui.local_backend.yield_cpu_to_engine) and slow the pilot's own key presses; tests that check the
    priority itself run it in a child process (tests/tui/test_tui_priority.py, the tmux test)."""
    import tui.local_backend

    monkeypatch.setattr(tui.local_backend, "yield_cpu_to_engine", lambda: None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that wait for a background run (tests/background_runs.py) go last: nothing waits behind them."""
    from tests.background_runs import COMMANDS

    items.sort(key=lambda item: item.name in COMMANDS)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background runs of the collected tests that wait for one (tests/background_runs.py)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or session.config.option.collectonly:
        return
    from tests import background_runs

    for name in {item.name for item in session.items} & background_runs.COMMANDS.keys():
        background_runs.start(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import background_runs

    background_runs.stop_all()


@pytest.fixture(scope="session")
def apis_server(smollm2_path: Path) -> Iterator[str]:
    """One `edgellm serve smollm2-135m` (smollm2_path: cached first) for the Ollama, Anthropic and Responses
    API tests (tests/test_api_*.py)."""
    from edgellm.testing.servers import start_server, stop_server

    proc, url = start_server("smollm2-135m", "--ctx", "512", "--threads", "1")
    try:
        yield url
    finally:
        stop_server(proc)
