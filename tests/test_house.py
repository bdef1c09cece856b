"""The house's rooms and the way between them: which part of the app may import which.

Rooms are cut by concern, not by a line count: ``tools/rooms.py`` reports their sizes and imports (no
cap). What is guarded is the direction: core under server under the window and the commands, the rooms
inside core as docs/architecture.md draws them, and no Qt below the window, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
PACKAGE = APP / "lazykv"

# room -> the rooms it may import (a room: a package of core, a module of core, or a top-level part)
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),  # its __init__
    "core.kinds": set(),
    "core.errors": set(),
    "core.paths": set(),
    "core.files": {"core.paths"},
    "core.chat": {"core.kinds", "core.errors"},
    "core.engine": {"core.chat", "core.kinds", "core.errors", "core.files", "core.paths"},
    "core.idle": {"core.engine", "core.kinds"},
    "core.settings": {"core.engine", "core.files", "core.idle", "core.kinds", "core.paths"},
    "core.history": {"core.chat", "core.engine", "core.files", "core.kinds", "core.errors", "core.paths",
                     "lazykv"},
    "core.models": {"core.engine", "core.kinds", "core.errors", "core.paths", "resources"},
    "core.tools": {"core.files", "core.paths"},
}
CORE = {room for room in MAY_IMPORT} | {"core"}
MAY_IMPORT.update({
    "server": CORE,
    "cli": CORE | {"server", "cli", "lazykv"},
    "qt": CORE | {"server", "lazykv", "resources"},
    "selftest": CORE | {"qt", "lazykv", "resources"},
    "__main__": CORE | {"qt", "cli", "lazykv"},
    "console": set(), "resources": set(), "lazykv": set(),
})


def room_of(module: str) -> str | None:
    """``lazykv.core.engine.planner`` -> ``core.engine``; ``lazykv.qt.worker`` -> ``qt``."""
    parts = module.split(".")
    if parts[0] != "lazykv":
        return None
    if len(parts) == 1:
        return "lazykv"
    if parts[1] == "core":
        return f"core.{parts[2]}" if len(parts) > 2 else "core"
    return parts[1]


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(APP).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def test_every_room_imports_only_the_rooms_under_it() -> None:
    found = modules()
    assert len(found) > 50  # the app's modules were found
    wrong = []
    for name, path in found.items():
        room = room_of(name)
        assert room in MAY_IMPORT, f"{name}: a room the house does not know ({room}); add it to MAY_IMPORT"
        for target in imports(path):
            other = room_of(target)
            if other is not None and other != room and other not in MAY_IMPORT[room]:
                wrong.append(f"{name} imports {target}")
    assert wrong == []


@pytest.mark.parametrize("part", ["core", "server", "cli"])
def test_no_qt_below_the_window_in_a_fresh_interpreter(part: str) -> None:
    """Every module of core, server and cli imports without PySide6 (nor llama_cpp's Qt-free clients
    pulling it in through another module)."""
    names = sorted(n for n in modules() if n.startswith(f"lazykv.{part}"))
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'PySide6'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_rooms_report_lists_every_room() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "rooms.py")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for room in ("core/engine", "core/history", "core/chat", "core/models", "qt", "server", "cli"):
        assert f"| {room} |" in out


def test_no_class_of_the_window_mixes_in_more_than_one_non_qt_class() -> None:
    """The window's parts are objects it holds (``chat``, ``loading``, ``closing``; Conversations'
    ``prompts``, ``private_chat``, ``files``), each seeing its host through a small Protocol: no class of
    lazykv.qt inherits from more than one class that is not Qt's (no mix-ins spreading one class over
    several files)."""
    names = sorted(n for n in modules() if n.startswith("lazykv.qt."))
    code = ("import importlib, inspect, json\n"
            "def qt(base):\n"
            "    return any(k.__module__.split('.')[0] in ('PySide6', 'shiboken6') for k in base.__mro__)\n"
            "found = {}\n"
            f"for name in {names!r}:\n"
            "    module = importlib.import_module(name)\n"
            "    for cls in vars(module).values():\n"
            "        if inspect.isclass(cls) and cls.__module__ == name:\n"
            "            found[f'{name}.{cls.__qualname__}'] = [b.__qualname__ for b in cls.__bases__\n"
            "                                                   if b is not object and not qt(b)]\n"
            "print(json.dumps(found))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    bases = json.loads(out.stdout)
    assert "lazykv.qt.main_window.MainWindow" in bases and "lazykv.qt.conversations.Conversations" in bases
    assert {cls: plain for cls, plain in bases.items() if len(plain) > 1} == {}
