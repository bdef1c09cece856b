"""Errors whose message is written for the user (the app shows it as it is)."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine could not do what was asked; the message is meant for the user."""


class ContextFullError(EngineError):
    """The conversation does not fit the context."""
