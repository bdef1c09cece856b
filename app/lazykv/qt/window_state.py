"""The window's size, position, docks and toolbars, remembered between runs (``window.ini`` next to the
settings; Qt's own blobs, so a damaged or foreign file is ignored, never fatal).

Restored once before the window is shown and saved once when it closes; the file is a few hundred
bytes. A restored geometry is clamped to the screen it lands on, so a window saved on a larger
monitor never opens wider than the current one.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QRect, QSettings
from PySide6.QtWidgets import QMainWindow

from lazykv.core.paths import PRIVATE_FILE, config_dir, private_dir, restrict

FILE_NAME = "window.ini"
STATE_VERSION = 1  # bump when docks or toolbars change in a way an old state must not be applied to


def state_file() -> Path:
    return config_dir() / FILE_NAME


def restore(window: QMainWindow, path: Path | None = None) -> bool:
    """Apply the saved geometry and dock layout (False when there is none or it is unusable), then
    make the window fit its screen."""
    store = QSettings(str(path or state_file()), QSettings.Format.IniFormat)
    geometry, state = store.value("geometry"), store.value("state")
    restored = isinstance(geometry, QByteArray) and window.restoreGeometry(geometry)
    if restored and isinstance(state, QByteArray):
        window.restoreState(state, STATE_VERSION)
    fit_to_screen(window)  # the default size too: a small screen gets a window that fits
    return restored


def save(window: QMainWindow, path: Path | None = None) -> None:
    target = path or state_file()
    private_dir(target.parent, own=True)
    if not target.exists():  # created owner-only: Qt writes it with the umask's mode otherwise
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE))
    store = QSettings(str(target), QSettings.Format.IniFormat)
    store.setValue("geometry", window.saveGeometry())
    store.setValue("state", window.saveState(STATE_VERSION))
    store.sync()
    restrict(target)  # Qt's save may replace the file with one of the umask's mode


def fit_to_screen(window: QMainWindow) -> None:
    """Shrink and move the window so that it lies inside the available area of its screen."""
    screen = window.screen()
    if screen is None:
        return
    area: QRect = screen.availableGeometry()
    frame = window.frameGeometry()
    extra_w, extra_h = frame.width() - window.width(), frame.height() - window.height()
    width = min(window.width(), area.width() - extra_w)
    height = min(window.height(), area.height() - extra_h)
    if (width, height) != (window.width(), window.height()):
        window.resize(width, height)
    x = min(max(frame.x(), area.left()), area.right() - width - extra_w + 1)
    y = min(max(frame.y(), area.top()), area.bottom() - height - extra_h + 1)
    if (x, y) != (frame.x(), frame.y()):
        window.move(x, y)
