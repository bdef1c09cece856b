"""Errors whose message is written for the user (the app shows it as it is)."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine could not do what was asked; the message is meant for the user.

    ``details`` is the technical account behind it (empty when the message says it all), for a
    "details" disclosure or the log; it is also a note of the exception, so tracebacks show it.
    """

    def __init__(self, message: str = "", details: str = "") -> None:
        super().__init__(message)
        self.details = details
        if details:
            self.add_note(details)


class ContextFullError(EngineError):
    """The conversation does not fit the context."""
