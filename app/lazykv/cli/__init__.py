"""Terminal subcommands of ``python -m lazykv``: one module per command in this package.

A module ``lazykv.cli.NAME`` is the command ``python -m lazykv NAME``. It defines ``main(argv) -> int``
(``argv`` without the command's name) and its first docstring line is the command's summary in
``python -m lazykv --help``. Subcommands are another client of ``lazykv.core``, like the window: they
never import Qt (``tests/test_cli.py`` checks it for every module here).
"""

from __future__ import annotations

import importlib
import pkgutil


def names() -> list[str]:
    """Every subcommand, in name order."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def is_subcommand(word: str) -> bool:
    return word in names()


def summary(name: str) -> str:
    """The first line of the command module's docstring."""
    doc = importlib.import_module(f"{__name__}.{name}").__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def run(name: str, argv: list[str]) -> int:
    return int(importlib.import_module(f"{__name__}.{name}").main(argv) or 0)


def epilog() -> str:
    """The subcommands for ``--help``."""
    found = names()
    if not found:
        return ""
    return "commands (python -m lazykv COMMAND --help):\n" + "\n".join(
        f"  {name:<10} {summary(name)}" for name in found
    )
