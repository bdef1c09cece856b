"""Fixtures shared by the core tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lazykv.core.history.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh conversation database that gives up on a held write lock after 50 ms."""
    s = Store(tmp_path / "conversations.sqlite3", tmp_path / "snapshots", busy_timeout_ms=50)
    yield s
    s.close()
