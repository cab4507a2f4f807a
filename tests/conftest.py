"""Shared test fixtures. Exercise notebooks are read with nbfiles.exercise_namespace (tools/)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
