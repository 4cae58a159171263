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
