"""The map of app/lazykv: each room (a package, or core's shared modules), its modules and lines, and the
rooms it imports. ``python tools/rooms.py`` prints it as a Markdown table (no limits: a report to read)."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
PACKAGE = APP / "lazykv"


def room(path: Path) -> str:
    """``core/engine``, ``qt``, ``core`` (core's shared modules), ``lazykv`` (the package's own)."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "lazykv"
    if parts[0] == "core" and len(parts) > 2:
        return f"core/{parts[1]}"
    return parts[0]


def target_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "lazykv" or len(parts) == 1:
        return None
    if parts[1] == "core" and len(parts) > 2 and (PACKAGE / "core" / parts[2]).is_dir():
        return f"core/{parts[2]}"
    return "lazykv" if (PACKAGE / f"{parts[1]}.py").exists() else parts[1]


def report() -> str:
    files: dict[str, list[int]] = defaultdict(list)
    uses: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        here = room(path)
        text = path.read_text(encoding="utf-8")
        files[here].append(len(text.splitlines()))
        for node in ast.walk(ast.parse(text)):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                other = target_room(name)
                if other is not None and other != here:
                    uses[here].add(other)
    lines = ["| room | modules | lines | largest | imports |", "|---|---|---|---|---|"]
    for name in sorted(files):
        sizes = files[name]
        lines.append(f"| {name} | {len(sizes)} | {sum(sizes)} | {max(sizes)} | "
                     f"{', '.join(sorted(uses[name])) or '-'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
