"""Tool calls and their results in the transcript: a collapsed line each ("Tool call: server › tool"),
expanded by a click, the keyboard or the message's menu; arguments and output shown as plain text, never
HTML, Markdown or a link."""

from __future__ import annotations

from unittest.mock import patch

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextCursor
from pytestqt.qtbot import QtBot

from lazykv.core.chat.conversation import Conversation
from lazykv.core.history.records import loaded
from lazykv.core.history.store import Store
from lazykv.core.kinds import ToolStatus
from lazykv.qt.transcript import TOOL_SCHEME, TranscriptView
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import chat, settle

ARGS = '{"html": "<b>bold?</b> <a href=\\"https://evil.example\\">click</a>", "md": "**not bold**"}'
OUTPUT = "<i>not italic</i> # not a heading\nhttps://example.com/open-me [x](https://evil.example)"
CALL = {"id": "call_1", "type": "function", "function": {"name": "files__read", "arguments": ARGS}}


def _conversation() -> Conversation:
    c = Conversation()
    c.add("user", "Read my file")
    c.add_tool_calls("Reading it.", [CALL])
    c.add_tool_result("call_1", "files__read", OUTPUT, ToolStatus.OK, truncated=True)
    c.add("assistant", "It says hello.")
    return c


def _shown(view: TranscriptView, qtbot: QtBot) -> None:
    c = _conversation()
    view.show_messages(c.shown(), c.markers(), c.stats())
    qtbot.waitUntil(lambda: view.rendered_count() == 4)


def _anchors(view: TranscriptView) -> list[str]:
    found, block = [], view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            if href := it.fragment().charFormat().anchorHref():
                found.append(href)
            it += 1
        block = block.next()
    return found


def _format_at(view: TranscriptView, text: str):  # noqa: ANN202 - QTextCharFormat
    found = view.document().find(text)
    assert not found.isNull(), f"{text!r} not in {view.toPlainText()!r}"
    cursor = QTextCursor(view.document())
    cursor.setPosition(found.selectionStart() + 1)
    return cursor.charFormat()


def test_calls_and_results_are_collapsed_lines_by_default(view: TranscriptView, qtbot: QtBot) -> None:
    _shown(view, qtbot)
    plain = view.toPlainText()
    assert "▸ Tool call: files › read" in plain
    assert "▸ Tool result: files › read · output cut to fit" in plain
    assert "bold?" not in plain and "not italic" not in plain  # collapsed: neither text shown
    assert view.tool_blocks(1) == [("Tool call: files › read", False)]
    assert view.tool_blocks(2) == [("Tool result: files › read · output cut to fit", False)]
    assert view.tool_blocks(3) == [] and "It says hello." in plain
    assert _anchors(view) == [f"{TOOL_SCHEME}:1/0", f"{TOOL_SCHEME}:2/0"]


def test_expanded_arguments_and_output_are_plain_text(view: TranscriptView, qtbot: QtBot) -> None:
    _shown(view, qtbot)
    view._on_link(QUrl(f"{TOOL_SCHEME}:1/0"))  # as a click on the line sends it
    view._on_link(QUrl(f"{TOOL_SCHEME}:2/0"))
    assert view.tool_blocks(1)[0][1] and view.tool_blocks(2)[0][1]
    plain = view.toPlainText()
    assert "▾ Tool call: files › read" in plain
    assert '"html": "<b>bold?</b> <a href=\\"https://evil.example\\">click</a>"' in plain  # literally
    assert '"md": "**not bold**"' in plain
    assert "<i>not italic</i> # not a heading\nhttps://example.com/open-me [x](https://evil.example)" in plain
    assert not _format_at(view, "bold?").font().bold()
    assert not _format_at(view, "not italic").font().italic()
    # the only links are the blocks' own lines: nothing in the arguments or the output opens anything
    assert _anchors(view) == [f"{TOOL_SCHEME}:1/0", f"{TOOL_SCHEME}:2/0"]
    with patch("lazykv.qt.transcript.QDesktopServices.openUrl") as opened:
        view._on_link(QUrl(f"{TOOL_SCHEME}:9/0"))  # no such message: nothing happens
        view._on_link(QUrl(f"{TOOL_SCHEME}:1/0"))
    opened.assert_not_called()
    assert not view.tool_blocks(1)[0][1] and "bold?" not in view.toPlainText()  # hidden again


def test_the_keyboard_reaches_a_block_and_opens_and_closes_it(view: TranscriptView, qtbot: QtBot) -> None:
    _shown(view, qtbot)
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    qtbot.keyClick(view, Qt.Key.Key_Tab)  # the first link: the call's line
    assert view.textCursor().selectedText() == "▸ Tool call: files › read"
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert view.tool_blocks(1)[0][1] and "bold?" in view.toPlainText()
    qtbot.keyClick(view, Qt.Key.Key_Return)  # the focus stayed on the same line
    assert not view.tool_blocks(1)[0][1] and "bold?" not in view.toPlainText()


def test_the_menu_shows_and_hides_a_block(view: TranscriptView, qtbot: QtBot) -> None:
    _shown(view, qtbot)
    actions = {a.text(): a for a in view.message_menu(2).actions()}
    actions["Show Tool result: files › read · output cut to fit"].trigger()
    assert "not italic" in view.toPlainText()
    hide = {a.text(): a for a in view.message_menu(2).actions()}
    assert "Hide Tool result: files › read · output cut to fit" in hide


def test_a_streamed_reply_gets_its_calls_and_a_result_is_added(view: TranscriptView) -> None:
    view.add_message("user", "Read my file")
    view.begin_reply()
    view.append_to_reply("Reading it.")
    view.end_reply()
    view.set_tool_calls(1, [CALL])
    view.add_turn(_conversation().shown()[2])
    denied = {"role": "tool", "tool_call_id": "call_2", "name": "clock__now", "content": "Denied.",
              "tool": {"status": "denied", "truncated": False, "server": "Clock", "tool": "now"}}
    view.add_turn(denied)
    plain = view.toPlainText()
    assert "Reading it." in plain and "▸ Tool call: files › read" in plain
    assert "▸ Tool result: Clock › now · denied by the user" in plain
    assert view.message_count() == 4 and view.message_text(3) == "Denied."


def test_tool_turns_another_window_saved_are_shown_when_merged(qtbot: QtBot, fake_window: FakeWindow) -> None:
    """Another LazyKV Chat wrote a tool round into the conversation on screen: the next save keeps it
    (merged) and the window shows it, its blocks included."""
    w = fake_window()
    chat(qtbot, w, "Hello")
    uid = w.conversations.chat.saved.uid

    def other_window(store: Store) -> None:  # as another process would, through its own sync
        record = store.conversation(store.list_conversations()[0].id)
        c = loaded(record).conversation
        c.add_tool_calls("", [CALL])
        c.add_tool_result("call_1", "files__read", OUTPUT)
        store.sync_transcript(uid, c.turns(), len(record.messages))

    w.database.call(other_window)
    chat(qtbot, w, "And then?")
    settle(qtbot, w)
    shown = w.conversation.shown()
    assert [t["role"] for t in shown[:4]] == ["user", "assistant", "assistant", "tool"]
    assert w.conversation.asks_for_tools(2)
    assert "▸ Tool call: files › read" in w.transcript.toPlainText()
