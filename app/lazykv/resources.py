"""Where the app's resources (icons, style sheet, templates) are: the source tree or the frozen bundle."""

from __future__ import annotations

import sys
from pathlib import Path

APP_ICON = "icons/lazykv.svg"


def resources_dir() -> Path | None:
    """``resources/`` beside the package in a source checkout, inside the bundle when frozen.

    None for an installed wheel, which does not carry them.
    """
    bundle = getattr(sys, "_MEIPASS", None)  # PyInstaller's unpacked bundle dir
    base = Path(bundle) if bundle else Path(__file__).resolve().parents[2]
    path = base / "resources"
    return path if path.is_dir() else None


def resource(name: str) -> Path | None:
    base = resources_dir()
    path = base / name if base is not None else None
    return path if path is not None and path.exists() else None
