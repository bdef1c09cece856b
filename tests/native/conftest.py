"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import filled


@pytest.fixture(scope="module", autouse=True)
def _free_filled_contexts() -> Iterator[None]:
    """The memoised filled contexts live as long as the module that made them."""
    yield
    filled.cache_clear()
