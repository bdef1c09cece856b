"""Light and dark themes: follow the system (the default), or force one.

"system" keeps the palette Qt got from the platform (GNOME/KDE colour scheme, Windows and macOS
dark mode). "light" and "dark" switch to the Fusion style with a palette of their own, the same on
every desktop. Widgets that draw their own colours (the transcript, the banners) follow palette
changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

_DARK = {
    QPalette.ColorRole.Window: "#202124", QPalette.ColorRole.WindowText: "#e8eaed",
    QPalette.ColorRole.Base: "#17181a", QPalette.ColorRole.AlternateBase: "#26282b",
    QPalette.ColorRole.Text: "#e8eaed", QPalette.ColorRole.Button: "#2b2d31",
    QPalette.ColorRole.ButtonText: "#e8eaed", QPalette.ColorRole.Highlight: "#3d6fb6",
    QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.ToolTipBase: "#2b2d31",
    QPalette.ColorRole.ToolTipText: "#e8eaed", QPalette.ColorRole.PlaceholderText: "#8a8f98",
    QPalette.ColorRole.Link: "#8ab4f8", QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Mid: "#3c4043", QPalette.ColorRole.Dark: "#111214",
    QPalette.ColorRole.Light: "#3c4043",
}
# Fusion outlines a check box in the window colour darkened: on a dark palette it all but vanished
DARK_SHEET = (
    "QCheckBox::indicator { width: 13px; height: 13px; border: 1px solid #9aa0a6; border-radius: 3px;"
    " background: #17181a; }"
    "QCheckBox::indicator:checked { background: #3d6fb6; border-color: #8ab4f8; }"
    "QCheckBox::indicator:disabled { border-color: #5f6368; }"
)


@dataclass(frozen=True)
class BannerColours:
    """A banner's (notice_banner.py) colours: a pale yellow in a light theme, a dark amber in a dark one
    (a bright yellow strip glares in a dark window); text on it at a contrast of at least 4.5:1."""

    background: str
    border: str
    text: str


LIGHT_BANNER = BannerColours("#fff8c5", "#d4a72c", "#1f2328")
DARK_BANNER = BannerColours("#3a3120", "#8a6d1f", "#f2e8cf")
_DISABLED_DARK = {QPalette.ColorRole.Text: "#6b6f76", QPalette.ColorRole.ButtonText: "#6b6f76",
                  QPalette.ColorRole.WindowText: "#6b6f76"}


class _SystemLook:
    """What the application looked like before any theme was forced, to go back to it."""

    style: str | None = None
    palette: QPalette | None = None


def apply(app: QApplication, theme: str) -> None:
    """Switch ``app`` to ``theme`` ("system", "light" or "dark")."""
    if _SystemLook.palette is None:
        _SystemLook.style = app.style().name()
        _SystemLook.palette = QPalette(app.palette())
    if theme == "system":
        app.setStyle(QStyleFactory.create(_SystemLook.style or "Fusion"))
        app.setPalette(_SystemLook.palette)
    else:
        app.setStyle(QStyleFactory.create("Fusion"))
        light = QStyleFactory.create("Fusion").standardPalette()
        app.setPalette(dark_palette() if theme == "dark" else light)
    fusion_dark = is_dark(app.palette()) and app.style().name().lower() == "fusion"
    app.setStyleSheet(DARK_SHEET if fusion_dark else "")


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in _DARK.items():
        palette.setColor(role, QColor(colour))
    for role, colour in _DISABLED_DARK.items():
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(colour))
    return palette


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


def banner_colours(palette: QPalette) -> BannerColours:
    """The banners' colours for a window with ``palette``."""
    return DARK_BANNER if is_dark(palette) else LIGHT_BANNER
