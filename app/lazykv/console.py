"""The app's own lines for the terminal, which a model being loaded must not swallow.

Asked not to be verbose, llama-cpp-python points the whole process's stdout and stderr (file
descriptors 1 and 2, and ``sys.stdout`` / ``sys.stderr``) at /dev/null while it loads a model,
on the engine's thread. A line the GUI thread wrote meanwhile was lost: a second start's
"bringing the window forward" (issue 17.1), the exit's "finishing before exit". ``hold`` keeps a
copy of stderr taken when the app starts, before any model loads; ``say`` writes there.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TextIO

_held: TextIO | None = None  # the copy of stderr, once held


def hold() -> None:
    """From now on ``say`` writes to a copy of the stderr of this moment (call it before any model
    loads); nothing changes where stderr is not a file descriptor (captured, or a windowed app)."""
    global _held
    if _held is not None or sys.stderr is None:
        return
    try:
        fd = os.dup(sys.stderr.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    _held = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")


def say(message: str) -> None:
    """``lazykv: message`` on the terminal."""
    stream = _held or sys.stderr
    if stream is not None:
        print(f"lazykv: {message}", file=stream, flush=True)
