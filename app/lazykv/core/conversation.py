"""The conversation as the engine sees it: an ordered list of {"role", "content"} messages."""

from __future__ import annotations

from typing import Literal

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")


class Conversation:
    """Messages in order; ``messages()`` hands out copies, safe to pass to another thread."""

    def __init__(self) -> None:
        self._messages: list[dict[str, str]] = []

    def add(self, role: Role, content: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self._messages.append({"role": role, "content": content})

    def pop(self) -> dict[str, str]:
        """Remove and return the last message (e.g. a user turn whose reply failed)."""
        return self._messages.pop()

    def clear(self) -> None:
        self._messages.clear()

    def messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self._messages]

    def __len__(self) -> int:
        return len(self._messages)
