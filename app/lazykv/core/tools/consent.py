"""The user's say on each tool call: Allow once, Always allow this tool, or Deny.

Only "Always" is remembered, per server and tool, in ``paths.tool_permissions_file()`` (owner-only);
a store made with no path (a Private chat) remembers it for its own life only and writes nothing.
Revoking takes a tool back to asking. The store is safe to use from any thread.
"""

from __future__ import annotations

import json
import threading
from enum import StrEnum
from pathlib import Path

from lazykv.core.files import write_text_atomic
from lazykv.core.paths import restrict

PERMISSIONS_VERSION = 1


class Decision(StrEnum):
    ALLOW_ONCE = "allow_once"
    ALWAYS = "always"
    DENY = "deny"


class ConsentStore:
    """The tools always allowed; ``path`` None keeps them in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.problem = ""  # a sentence when the file could not be read or written (it then asks again)
        self._always: list[tuple[str, str]] = self._read() if path is not None else []

    def allowed(self, server: str, tool: str) -> bool:
        """Whether the user chose "Always allow this tool" for this server's tool."""
        with self._lock:
            return (server, tool) in self._always

    def record(self, server: str, tool: str, decision: Decision | str) -> None:
        """Note the user's decision; only ALWAYS is kept (ALLOW_ONCE and DENY ask again next time)."""
        if Decision(decision) is not Decision.ALWAYS:
            return
        with self._lock:
            if (server, tool) not in self._always:
                self._always.append((server, tool))
                self._write()

    def revoke(self, server: str, tool: str) -> None:
        """The tool asks again before its next call."""
        with self._lock:
            if (server, tool) in self._always:
                self._always.remove((server, tool))
                self._write()

    def remembered(self) -> list[tuple[str, str]]:
        """The (server, tool) pairs always allowed, in the order they were allowed."""
        with self._lock:
            return list(self._always)

    def _read(self) -> list[tuple[str, str]]:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            pairs = [(str(p["server"]), str(p["tool"])) for p in data["always"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as e:
            # a damaged file allows nothing: every tool asks again, which is the safe side
            self.problem = f"The remembered tool permissions ({self.path}) could not be read ({e}); " \
                "every tool asks again."
            return []
        return list(dict.fromkeys(pairs))

    def _write(self) -> None:
        if self.path is None:
            return
        data = {"version": PERMISSIONS_VERSION,
                "always": [{"server": s, "tool": t} for s, t in self._always]}
        try:
            write_text_atomic(self.path, json.dumps(data, indent=2) + "\n")
            restrict(self.path)
        except OSError as e:
            self.problem = f"The tool permissions could not be saved ({e}); they last until the app quits."
