"""The friction a new user hit (issue 45), in the window's look: a wide code block scrolled the whole
transcript sideways, the dark theme kept glaring yellow banners, the smallest window left a sliver of
transcript."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from lazykv.qt import theme
from lazykv.qt.notice_banner import NoticeBanner
from lazykv.qt.step_banner import StepBanner
from lazykv.qt.transcript import TranscriptView
from tests.qt.conftest import FakeWindow

CODE_LINE = ("values = [" + ", ".join(f"{i:03d}" for i in range(100)))[:399] + "]"  # 400 characters
CODE_WORD = "x" * 400  # no space to wrap at
TRANSCRIPT_MIN = 200  # px: the transcript's height at the window's smallest


def test_a_wide_code_block_wraps_inside_its_message_and_stays_whole(qtbot: QtBot) -> None:
    assert len(CODE_LINE) == 400
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    qtbot.waitExposed(view)
    text = f"Two:\n\n```python\n{CODE_LINE}\n    done()\n```\n\n```\n{CODE_WORD}\n```\n"
    view.add_message("assistant", text)
    QApplication.processEvents()

    width = view.viewport().width()
    assert view.horizontalScrollBar().maximum() == 0  # the transcript does not scroll sideways
    assert view.document().size().width() <= width
    layout = view.document().documentLayout()
    messages = view.document().rootFrame().childFrames()
    assert messages and all(layout.frameBoundingRect(f).right() <= width for f in messages)
    # the code is all there: wrapped on screen, whole in the text, a copy and the Copy link
    assert view.code_blocks(0) == [f"{CODE_LINE}\n    done()", CODE_WORD]
    text = view.toPlainText()
    assert CODE_LINE in text and CODE_WORD in text and "\n    done()" in text
    for code in (CODE_LINE, CODE_WORD):  # wrapped in lines, each continuation indented under the first
        block = view.document().find(code[:40]).block()
        assert block.text() == code
        lines = [block.layout().lineAt(i) for i in range(block.layout().lineCount())]
        assert len(lines) > 1 and all(line.x() > lines[0].x() for line in lines[1:])
        assert sum(line.textLength() for line in lines) == len(code)


def _luminance(colour: QColor) -> float:
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * linear(colour.redF()) + 0.7152 * linear(colour.greenF()) + 0.0722 * linear(colour.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """WCAG 2 contrast ratio."""
    light, dark = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


@pytest.mark.parametrize("name", ["light", "dark"])
def test_banners_take_their_colours_from_the_theme(qtbot: QtBot, name: str) -> None:
    app = QApplication.instance()
    notice, conversion = NoticeBanner("test-banner"), StepBanner()
    notice.show_choices("The history could not be opened.", [("Retry", lambda: None)])
    conversion.show_progress("Reading the conversation again… 40%", 0.4)
    try:
        # made before the switch: a banner follows the theme while it is shown
        theme.apply(app, "dark" if name == "light" else "light")
        theme.apply(app, name)
        for banner in (notice, conversion):
            qtbot.addWidget(banner)
            banner.resize(500, banner.sizeHint().height())
            image = banner.grab().toImage()
            background = image.pixelColor(3, banner.height() // 2)  # inside the border, before the text
            text = banner.label.palette().color(banner.label.foregroundRole())
            window = app.palette().color(app.palette().ColorRole.Window)
            assert (background.lightness() < 128) == (window.lightness() < 128) == (name == "dark"), (
                background.name(), window.name())
            assert contrast(text, background) >= 4.5, (text.name(), background.name())
    finally:
        theme.apply(app, "system")


def test_the_smallest_window_keeps_room_for_the_transcript(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    w.demo_notice.show_choices("This is the small demo model: load a real one from File > Models.", [])
    w.remote_notice.show_choices("192.168.1.20:50052 did not answer: the model loaded without it.",
                                 [("Retry", lambda: None)], details="connection refused")
    w.banner.show_progress("Reading the conversation again… 40%", 0.4, can_stop=True)
    banners = (w.demo_notice, w.remote_notice, w.banner)

    def smallest() -> bool:  # the minimum follows what is shown, a layout request a level at a time
        QApplication.processEvents()
        w.resize(1, 1)
        QApplication.processEvents()
        return w.size() == w.minimumSize() == w.minimumSizeHint()

    for shown in (True, False):
        for banner in banners:
            banner.setVisible(shown)
        qtbot.waitUntil(smallest)
        transcript = w.transcript.geometry()
        assert transcript.height() >= TRANSCRIPT_MIN, (shown, transcript, w.size())
        siblings = [c for c in w.centralWidget().findChildren(QWidget) if c.parent() is w.centralWidget()]
        covering = [c for c in siblings if c is not w.transcript and c.isVisible()
                    and c.geometry().intersects(transcript)]
        assert not covering, (transcript, [(type(c).__name__, c.geometry()) for c in covering])
    # words, not letters, a line: the banner's sentence has room beside its bar (it had 4 px)
    for banner in banners:
        banner.show()
    qtbot.waitUntil(smallest)
    label = w.banner.label
    assert label.width() >= label.fontMetrics().horizontalAdvance("conversation") + 20, label.width()
