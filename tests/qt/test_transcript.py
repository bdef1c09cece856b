"""The transcript view on its own: Markdown replies, code blocks with Copy, text that is never HTML,
streaming re-rendered with a throttle, long conversations opened without stalling the GUI."""

from __future__ import annotations

import gc
import re

import pytest
from hypothesis import HealthCheck, given, settings
from PySide6.QtCore import QPoint, QUrl
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QTextCharFormat,
    QTextCursor,
    QTextTable,
)
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from lazykv.core.chat.conversation import Marker
from lazykv.qt import theme
from lazykv.qt.markdown import COPY_SCHEME
from lazykv.qt.stall_meter import StallMeter
from lazykv.qt.transcript import TranscriptView
from tests.support.unicode_text import ANY_TEXT, visible

REPLY = """Here is **bold** and `inline code`.

| name | value |
|------|------:|
| a    | 1     |

```python
def answer() -> int:
    return 42
```
"""


def _char_format_at(view: TranscriptView, text: str) -> QTextCharFormat:
    """The format of the first character of ``text`` in the document."""
    found = view.document().find(text)
    assert not found.isNull(), f"{text!r} not in {view.toPlainText()!r}"
    cursor = QTextCursor(view.document())
    cursor.setPosition(found.selectionStart() + 1)
    return cursor.charFormat()


def _format_at(view: TranscriptView, text: str) -> QFont:
    return _char_format_at(view, text).font()


def test_markdown_reply_is_rendered_not_shown_raw(view: TranscriptView) -> None:
    view.add_message("assistant", REPLY)
    plain = view.toPlainText()
    assert "**" not in plain and "```" not in plain and "|---" not in plain
    assert _format_at(view, "bold").bold()
    tables = [f for f in _all_frames(view) if isinstance(f, QTextTable)]
    assert len(tables) == 2  # the Markdown table and the code block's box


def test_code_block_is_monospace(view: TranscriptView) -> None:
    view.add_message("assistant", REPLY)
    code, prose = _format_at(view, "return 42"), _format_at(view, "Here is")
    assert code.family() != prose.family()
    assert code.family() == QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()


def test_copy_link_copies_the_code_block(view: TranscriptView, qtbot: QtBot) -> None:
    view.add_message("user", "show me")
    view.add_message("assistant", REPLY)
    assert "Copy" in view.toPlainText()
    QGuiApplication.clipboard().clear()
    with qtbot.waitSignal(view.code_copied, timeout=1000):
        view.anchorClicked.emit(QUrl(f"{COPY_SCHEME}:1/0"))
    assert QGuiApplication.clipboard().text() == "def answer() -> int:\n    return 42"
    assert view.code_blocks(1) == ["def answer() -> int:\n    return 42"]


def test_text_from_the_model_or_the_user_is_never_html(view: TranscriptView) -> None:
    view.add_message("user", "<b>not bold</b> & <img src='x'>")
    view.add_message("assistant", "<i>raw</i> <script>x</script> ![pic](file:///etc/passwd) "
                     "![web](https://example.com/a.png)")
    plain = view.toPlainText()
    assert "<b>not bold</b> & <img src='x'>" in plain
    assert "<i>raw</i> <script>x</script>" in plain
    assert not _format_at(view, "not bold").bold()
    assert not _format_at(view, "raw").italic()
    assert not _has_images(view)  # nothing is loaded from disk or the network to show a message


def test_markers_stay_inline(view: TranscriptView) -> None:
    view.add_message("assistant", "first half. second half.", [Marker(0, 12, "8-bit KV from here")])
    assert "first half. ⟨8-bit KV from here⟩ second half." in " ".join(view.toPlainText().split())


def test_a_message_that_looks_like_a_marker_opens(view: TranscriptView, qtbot: QtBot) -> None:
    """Issue 24: U+E000, digits, U+E001 in a message made every render of it raise, so its
    conversation never opened again."""
    messages = [{"role": "user", "content": "paste \ue0003\ue001 from a PDF"},
                {"role": "assistant", "content": "echo \ue0003\ue001 and `\ue0001\ue001`"}]
    view.show_messages(messages, [Marker(1, 5, "8-bit KV from here")])
    qtbot.waitUntil(lambda: view.rendered_count() == 2)
    plain = " ".join(view.toPlainText().split())
    assert "paste \ue0003\ue001 from a PDF" in plain
    assert "echo ⟨8-bit KV from here⟩ \ue0003\ue001 and \ue0001\ue001" in plain


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ANY_TEXT)
def test_any_text_is_shown_without_raising_and_kept(view: TranscriptView, qtbot: QtBot, text: str) -> None:
    """Typed, imported or streamed: whatever a message holds is shown, copied back as it was."""
    view.show_messages([{"role": "user", "content": text}, {"role": "assistant", "content": text}],
                       [Marker(1, len(text) // 2, "here")])
    qtbot.waitUntil(lambda: view.rendered_count() == 2)
    view.begin_reply()
    for k in range(0, len(text), 7):
        view.append_to_reply(text[k:k + 7])
    view.end_reply("note")
    assert [view.message_text(i) for i in range(3)] == [text, text, text]
    users = view.document().rootFrame().childFrames()[0]
    cursor = users.firstCursorPosition()
    cursor.setPosition(users.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
    assert visible(cursor.selection().toPlainText()) == visible("You" + text)  # as typed
    assert view.toPlainText().rstrip().endswith("note")


def test_streaming_rerenders_only_the_reply_and_is_throttled(
    view: TranscriptView, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces arriving faster than RENDER_INTERVAL_MS are rendered together, once the interval has
    passed: 120 pieces are one render; the user's message is never rendered again."""
    view.add_message("user", "Write code")
    fills: list[int] = []
    fill = TranscriptView._fill
    monkeypatch.setattr(TranscriptView, "_fill", lambda self, frame, index: (fills.append(index),
                                                                               fill(self, frame, index)))
    renders: list[str] = []  # the reply's text at each render
    render = TranscriptView._render_reply
    monkeypatch.setattr(TranscriptView, "_render_reply", lambda self: (
        renders.append(self.message_text(self._reply)) if self._reply is not None else None, render(self)))
    view.begin_reply()
    assert fills == [1] and renders == [""]  # the reply's empty frame
    pieces = ["Sure:\n\n", "```python\n", "print(", "'hi')\n", "```\n", "Done **now**."] * 20
    for piece in pieces:
        view.append_to_reply(piece)
    assert renders == [""]  # the pieces wait for the timer
    qtbot.waitUntil(lambda: len(renders) == 2)
    assert renders[1] == "".join(pieces)  # all 120 in one render
    view.append_to_reply(" More.")
    assert len(renders) == 2
    qtbot.waitUntil(lambda: len(renders) == 3)
    view.end_reply("stopped")
    assert fills == [1] and len(renders) == 4  # end_reply's own, with the note
    text = view.toPlainText()
    assert "print('hi')" in text and "Done now. More." in text and text.rstrip().endswith("stopped")
    assert view.message_text(1) == "".join(pieces) + " More."


def test_dark_theme_recolours_the_transcript(view: TranscriptView, qtbot: QtBot) -> None:
    view.add_message("assistant", REPLY)
    light = _frame_background(view)
    app = QApplication.instance()
    theme.apply(app, "dark")
    try:
        qtbot.waitUntil(lambda: _frame_background(view) != light)
        assert QColor(_frame_background(view)).lightness() < 80
        assert QColor(_char_format_at(view, "Here is").foreground().color()).lightness() > 150
        assert "Here is" in view.toPlainText()
    finally:
        theme.apply(app, "system")
    qtbot.waitUntil(lambda: _frame_background(view) == light)


def _frame_background(view: TranscriptView) -> str:
    return view.document().rootFrame().childFrames()[0].frameFormat().background().color().name()


def _messages(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append({"role": "user", "content": f"Question {i}: how do I reverse a list in place?"})
        else:
            out.append({"role": "assistant", "content": f"Answer {i}: use **list.reverse()**.\n\n"
                        "```python\nitems = [1, 2, 3]\nitems.reverse()\n```\nIt returns `None`."})
    return out


@pytest.mark.parametrize("n", [4000, 100_000])
def test_opening_a_long_conversation_keeps_the_gui_responsive(
    view: TranscriptView, qtbot: QtBot, n: int
) -> None:
    view.show_messages(_messages(10))  # the first render loads Pygments' lexers: not what is measured
    messages = _messages(n)
    gc.collect()  # a full collection of the test's own 100,000 fresh dicts is not the view's work
    meter = StallMeter()
    meter.start()
    view.show_messages(messages)
    qtbot.waitUntil(lambda: not view.laying_out())  # the view and a screen more are filled
    meter.stop()
    # the GUI thread's own work between ticks: other processes on a shared machine cannot fail it
    assert meter.max_cpu_gap_ms < 50, f"longest GUI-thread work between ticks {meter.max_cpu_gap_ms:.0f} ms"
    assert view.message_count() == n
    assert 0 < view.rendered_count() < 100
    assert f"Answer {n - 1}:" in view.toPlainText()
    bar = view.verticalScrollBar()
    assert bar.value() == bar.maximum()  # opened at the end


def test_scrolling_up_renders_older_messages_without_stalling(view: TranscriptView, qtbot: QtBot) -> None:
    view.show_messages(_messages(10))
    view.show_messages(_messages(2000))
    qtbot.waitUntil(lambda: not view.laying_out())
    before = view.rendered_count()
    meter = StallMeter()
    meter.start()
    for _ in range(10):  # a user scrolling up, ten times: each time, older messages come
        shown = view.rendered_count()
        view.verticalScrollBar().setValue(0)
        qtbot.waitUntil(lambda shown=shown: view.rendered_count() > shown)
    meter.stop()
    # the GUI thread's own work between ticks: other processes on a shared machine cannot fail it
    assert meter.max_cpu_gap_ms < 50, f"longest GUI-thread work between ticks {meter.max_cpu_gap_ms:.0f} ms"
    assert view.rendered_count() > before
    assert not view.following()
    first = 2000 - view.rendered_count()
    assert f"↑ {first} earlier messages" in view.toPlainText()
    # the message under a point is still found after frames were put in front of it
    for y in range(5, view.viewport().height(), 37):
        point = QPoint(60, y)
        index, line = view.message_at(point), view.cursorForPosition(point).block().text()
        if index is not None and line not in ("You", "Assistant", ""):
            words = set(re.findall(r"\w+", view.message_text(index)))
            assert first <= index < 2000 and set(re.findall(r"\w+", line)) <= words, (index, line)


def test_follows_a_streaming_reply_unless_scrolled_up(view: TranscriptView, qtbot: QtBot) -> None:
    view.show_messages(_messages(40))
    qtbot.waitUntil(lambda: not view.laying_out())
    bar = view.verticalScrollBar()
    assert bar.value() == bar.maximum()
    view.begin_reply()
    for _ in range(30):
        view.append_to_reply("a line of the reply\n\n")
    qtbot.waitUntil(lambda: view.toPlainText().count("a line of the reply") == 30)
    assert bar.value() == bar.maximum() and view.following()
    bar.setValue(bar.maximum() // 2)
    held = bar.value()
    for _ in range(30):
        view.append_to_reply("more text\n\n")
    qtbot.waitUntil(lambda: view.toPlainText().count("more text") == 30)
    view.end_reply()
    assert bar.value() == held and not view.following()


def _has_images(view: TranscriptView) -> bool:
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            if it.fragment().charFormat().isImageFormat():
                return True
            it += 1
        block = block.next()
    return False


def _all_frames(view: TranscriptView) -> list:
    out, stack = [], [view.document().rootFrame()]
    while stack:
        frame = stack.pop()
        out.append(frame)
        stack.extend(frame.childFrames())
    return out
