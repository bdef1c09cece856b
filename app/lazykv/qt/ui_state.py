"""The window's name and its state, which says which actions are open: no model, loading, ready,
replying."""

from __future__ import annotations

import enum

APP_TITLE = "LazyKV Chat"


class UiState(enum.Enum):
    NO_MODEL = enum.auto()
    LOADING = enum.auto()
    READY = enum.auto()
    REPLYING = enum.auto()
