"""The transcript: one framed block per message, replies rendered as Markdown, markers inline.

Long conversations open at once: only the newest messages that fill the view (and a screen more)
are laid out; older ones are rendered a few at a time, each step within a small time budget, as the
user scrolls up to them. A streaming reply is rendered at most every ``RENDER_INTERVAL_MS``, and
only its last Markdown block: the blocks before it are complete, rendered once into a sub-frame of
their own, and never touched again. The view follows the end unless the user has scrolled up.

Right-click a message to copy it, edit and resend a message of yours, or regenerate the last
reply; the view only asks (signals), the window decides. Code blocks have a one-click Copy.

A reply's tool calls and each tool's result are blocks under it, collapsed to one line ("Tool call:
server › tool"); a click, or Tab to the line and Enter, shows the arguments or the output. Both are
untrusted text: shown as plain text, never as HTML or Markdown, never a link.
"""

from __future__ import annotations

import bisect
import html
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QEvent, QPoint, QTimer, QUrl, Signal, Slot
from PySide6.QtGui import (
    QColor,
    QContextMenuEvent,
    QDesktopServices,
    QFont,
    QFontDatabase,
    QFontMetricsF,
    QGuiApplication,
    QTextCursor,
    QTextFrame,
    QTextFrameFormat,
    QTextOption,
)
from PySide6.QtWidgets import QMenu, QTextBrowser, QWidget

from lazykv.core.chat.conversation import (
    Marker,
    ReplyStats,
    pretty_arguments,
    tool_calls_of,
    tool_label,
    tool_result_label,
    tool_result_note,
)
from lazykv.qt.markdown import (
    COPY_SCHEME,
    DARK,
    LIGHT,
    TAB_COLUMNS,
    MarkdownRenderer,
    Palette,
    preload_lexers,
)
from lazykv.qt.theme import is_dark

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
_BACKGROUNDS = {
    LIGHT: {"user": "#e3edfd", "assistant": "#f3f4f6", "system": "#fff7e0", "tool": "#eef6ee"},
    DARK: {"user": "#1d2b40", "assistant": "#24272d", "system": "#3a3220", "tool": "#1f2d24"},
}
TOOL_SCHEME = "lazykv-tool"  # a tool block's line: lazykv-tool:MESSAGE/BLOCK shows or hides it
_COLLAPSED, _EXPANDED = "▸", "▾"
RENDER_INTERVAL_MS = 80  # a streaming reply is re-rendered at most this often
STEP_BUDGET_S = 0.006  # rendering work per event-loop turn when filling the view or loading older ones
STEP_PAUSE_MS = 1  # between two steps: the events that came meanwhile run first
# px: the smallest window (its banners shown) still shows a few lines of the chat, ~35 columns wide
MIN_WIDTH, MIN_HEIGHT = 280, 200
PLAIN_OVER_CHARS = 60_000  # longer messages are shown as typed: parsing them would stall the GUI
_LINK_SCHEMES = {"http", "https", "mailto"}


@dataclass
class _Stream:
    """The reply being streamed: its text up to ``done_chars`` is rendered for good; ``tail`` is the
    sub-frame (inside the message's frame) holding the rest, re-rendered as it grows."""

    tail: QTextFrame
    done_chars: int = 0
    done_blocks: int = 0  # code blocks in the part rendered for good


@dataclass(frozen=True)
class _ToolBlock:
    """A tool call or result under a message: its line, and the text it shows when expanded."""

    title: str  # "Tool call: server › tool", "Tool result: server › tool · denied by the user"
    text: str  # the arguments, the output: plain text


@dataclass
class _Message:
    role: str
    text: str
    markers: list[tuple[int, str]] = field(default_factory=list)  # (offset, label) inside the text
    lines: list[str] = field(default_factory=list)  # what happened after it, each a line under it
    note: str = ""  # e.g. "Reply stopped", under the message
    stats: str = ""  # e.g. "0.4 s to first token · 31.2 tokens/s", under a reply
    code_blocks: list[str] = field(default_factory=list)
    tools: list[_ToolBlock] = field(default_factory=list)  # a reply's calls, a tool's result
    expanded: set[int] = field(default_factory=set)  # which of ``tools`` show their text


class TranscriptView(QTextBrowser):
    edit_requested = Signal(int)  # index of a user turn
    regenerate_requested = Signal()
    branch_requested = Signal(int)  # index of the message a branch ends with ("Branch from here")
    code_copied = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.document().setDocumentMargin(10)
        self.setMinimumSize(MIN_WIDTH, MIN_HEIGHT)  # the window's minimum size grows to keep it
        # a long word or code line wraps (markdown.py): every message is the view's width
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_link)
        self._messages: list[_Message | Mapping[str, Any]] = []
        self._markers: dict[int, list[tuple[int, str]]] = {}  # of the messages not made _Message yet
        self._stats: dict[int, ReplyStats] = {}  # likewise
        self._frames: list[QTextFrame] = []  # frames of messages[self._first:], in order
        self._first = 0
        self._left_out = 0  # the messages before this were dropped to fit the context: shown greyed
        self._reply: int | None = None  # index of the reply being streamed
        self._stream: _Stream | None = None  # how far it is rendered (None while it is not laid out)
        self._follow = True  # keep the end in view
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_reply)
        self._older_timer = QTimer(self)
        self._older_timer.setSingleShot(True)
        self._older_timer.setInterval(STEP_PAUSE_MS)
        self._older_timer.timeout.connect(self._render_older_step)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)
        self.actions_enabled = True
        self._apply_palette()
        preload_lexers()

    # -- content ----------------------------------------------------------------------------------

    def add_message(self, role: str, text: str, markers: Iterable[Marker] = ()) -> None:
        self.add_turn({"role": role, "content": text}, markers)

    def add_turn(self, turn: Mapping[str, Any], markers: Iterable[Marker] = ()) -> None:
        """A turn as the conversation holds it (``Conversation.shown()``): a reply's tool calls and a
        tool's result shown as collapsed blocks."""
        self._messages.append(_message(turn, [(m.offset, m.label) for m in markers]))
        self._append_frame(len(self._messages) - 1)

    def set_tool_calls(self, index: int, tool_calls: Sequence[Mapping[str, Any]]) -> None:
        """The reply at ``index`` (e.g. the one just streamed) asks for these tools: a collapsed block
        each under its text."""
        message = self._message(index)
        message.tools, message.expanded = _call_blocks(tool_calls), set()
        self._rerender(index)

    def tool_blocks(self, index: int) -> list[tuple[str, bool]]:
        """(line, expanded) of each tool block of message ``index``."""
        message = self._message(index)
        return [(block.title, k in message.expanded) for k, block in enumerate(message.tools)]

    def toggle_tool_block(self, index: int, block: int) -> None:
        """Show block ``block`` of message ``index`` if hidden, else hide it (its line stays)."""
        message = self._message(index)
        if not 0 <= block < len(message.tools):
            return
        message.expanded ^= {block}
        self._rerender(index)
        self._focus_link(index, f"{TOOL_SCHEME}:{index}/{block}")

    def show_messages(self, messages: Iterable[Mapping[str, Any]], markers: Iterable[Marker] = (),
                      stats: Mapping[int, ReplyStats] | None = None, left_out: int = 0) -> None:
        """Replace the whole transcript (opening a conversation, after an edit): the newest first;
        ``stats`` are the replies' figures by message index, shown under them; the first ``left_out``
        messages are no longer sent to the model (greyed)."""
        self._left_out = left_out
        self._markers = {}
        for marker in markers:
            self._markers.setdefault(marker.message_index, []).append((marker.offset, marker.label))
        self._stats = dict(stats or {})
        self._messages = list(messages)  # each becomes a _Message when it is first needed
        self._reset_document()
        self._follow = True
        self._render_older_step(fill_only=True)

    def message_count(self) -> int:
        return len(self._messages)

    def rendered_count(self) -> int:
        """How many of the newest messages are laid out (the rest render as the user scrolls up)."""
        return len(self._frames)

    def laying_out(self) -> bool:
        """Older messages are being laid out, a step per event-loop turn (filling the view, or the
        user scrolled up to them)."""
        return self._older_timer.isActive()

    def message_text(self, index: int) -> str:
        return self._message(index).text

    def code_blocks(self, index: int) -> list[str]:
        return list(self._message(index).code_blocks)

    def _message(self, index: int) -> _Message:
        entry = self._messages[index]
        if not isinstance(entry, _Message):
            entry = _message(entry, self._markers.pop(index, []))
            if (stats := self._stats.pop(index, None)) is not None:
                entry.stats, entry.note = stats.summary(), stats.note
            self._messages[index] = entry
        return entry

    # -- the streaming reply ----------------------------------------------------------------------

    def begin_reply(self) -> None:
        self._messages.append(_Message("assistant", ""))
        self._reply = len(self._messages) - 1
        self._append_frame(self._reply)

    @Slot(str)
    def append_to_reply(self, piece: str) -> None:
        if self._reply is not None and piece:
            self._message(self._reply).text += piece
            if not self._render_timer.isActive():
                self._render_timer.start()

    def mark_here(self, label: str, before_reply: bool = False) -> None:
        """A line under the reply being streamed (``before_reply``: under the message before it, the
        reply has no text yet), else under the last message."""
        index = self._reply if self._reply is not None else len(self._messages) - 1
        index -= 1 if before_reply and self._reply is not None else 0
        if index < 0:
            return
        self._message(index).lines.append(label)
        if index == self._reply:
            self._render_reply()
        else:
            self._rerender(index)

    def end_reply(self, note: str | None = None, stats: str | None = None) -> None:
        """Close the streaming reply, with ``note`` (e.g. "Reply stopped") and ``stats`` shown under it."""
        if self._reply is None:
            return
        self._render_timer.stop()
        self._message(self._reply).note = note or ""
        self._message(self._reply).stats = stats or ""
        self._render_reply()
        index, self._reply, self._stream = self._reply, None, None
        if self._message(index).tools:  # tool calls given while it streamed: shown with it now
            self._rerender(index)

    @Slot()
    def _render_reply(self) -> None:
        """Render what is new in the streaming reply: complete blocks for good, then the last one."""
        stream = self._stream
        if self._reply is None or stream is None:
            return
        message = self._message(self._reply)
        done = stream.done_chars
        complete = self._renderer.complete_prefix(message.text[done:])
        if complete:
            part = self._render_part(message, done, done + complete, stream.done_blocks)
            self._fill_html(stream.tail, part)
            stream.done_chars += complete
            stream.done_blocks = len(message.code_blocks)
            cursor = QTextCursor(self.document())
            cursor.setPosition(stream.tail.lastPosition() + 1)  # the block after it, in the message
            stream.tail = cursor.insertFrame(QTextFrameFormat())
        rest = self._render_part(message, stream.done_chars, len(message.text), stream.done_blocks)
        self._fill_html(stream.tail, rest + self._footer_html(message))

    def _render_part(self, message: _Message, start: int, end: int, first_block: int) -> str:
        """HTML of ``message.text[start:end]``; its code blocks replace those from ``first_block`` on."""
        text = message.text[start:end]
        markers = [(offset - start, label) for offset, label in message.markers
                   if start <= offset < end or offset == end == len(message.text)]
        rendered = self._renderer.render(text, self._reply or 0, markers, first_block)
        message.code_blocks[first_block:] = rendered.code_blocks
        return rendered.html

    # -- menus and links --------------------------------------------------------------------------

    def message_at(self, pos: QPoint) -> int | None:
        """Index of the message under a viewport position."""
        position = self.cursorForPosition(pos).position()
        starts = [frame.firstPosition() for frame in self._frames]
        k = bisect.bisect_right(starts, position) - 1
        if k < 0 or position > self._frames[k].lastPosition():
            return None
        return self._first + k

    def message_menu(self, index: int) -> QMenu:
        """The actions for one message (also used by tests and keyboard users)."""
        menu = QMenu(self)
        copy = menu.addAction("Copy message")
        copy.triggered.connect(lambda: QGuiApplication.clipboard().setText(self._message(index).text))
        for k, _ in enumerate(self._message(index).code_blocks):
            action = menu.addAction(f"Copy code block {k + 1}")
            action.triggered.connect(lambda _=False, k=k: self._copy_code(index, k))
        for k, (title, expanded) in enumerate(self.tool_blocks(index)):
            action = menu.addAction(f"{'Hide' if expanded else 'Show'} {title}")
            action.triggered.connect(lambda _=False, k=k: self.toggle_tool_block(index, k))
        role = self._message(index).role
        if role == "user":
            edit = menu.addAction("Edit and resend…")
            edit.setEnabled(self.actions_enabled)
            edit.triggered.connect(lambda: self.edit_requested.emit(index))
        if role == "assistant" and index == len(self._messages) - 1:
            regen = menu.addAction("Regenerate")
            regen.setEnabled(self.actions_enabled)
            regen.triggered.connect(self.regenerate_requested.emit)
        branch = menu.addAction("Branch from here")
        branch.setToolTip("A new conversation with the messages up to and including this one")
        branch.setEnabled(self.actions_enabled)
        branch.triggered.connect(lambda: self.branch_requested.emit(index))
        return menu

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        index = self.message_at(event.pos())
        if index is None:
            super().contextMenuEvent(event)
            return
        menu = self.message_menu(index)
        menu.addSeparator()
        menu.addActions(self.createStandardContextMenu().actions())
        menu.exec(event.globalPos())

    @Slot(QUrl)
    def _on_link(self, url: QUrl) -> None:
        if url.scheme() in (COPY_SCHEME, TOOL_SCHEME):
            message, _, block = url.path().partition("/")
            if not (message.isdigit() and block.isdigit() and int(message) < len(self._messages)):
                return
            if url.scheme() == COPY_SCHEME:
                self._copy_code(int(message), int(block))
            else:
                self.toggle_tool_block(int(message), int(block))
        elif url.scheme() in _LINK_SCHEMES:
            QDesktopServices.openUrl(url)

    def _focus_link(self, index: int, href: str) -> None:
        """Put the keyboard's focus on the link ``href`` of message ``index`` again (re-rendering the
        message lost it), so that Enter toggles the same block again."""
        if index < self._first:
            return
        frame = self._frames[index - self._first]
        block = self.document().findBlock(frame.firstPosition())
        while block.isValid() and block.position() <= frame.lastPosition():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.charFormat().anchorHref() == href:
                    cursor = QTextCursor(self.document())
                    cursor.setPosition(fragment.position())
                    cursor.setPosition(fragment.position() + fragment.length(),
                                       QTextCursor.MoveMode.KeepAnchor)
                    self.setTextCursor(cursor)
                    return
                it += 1
            block = block.next()

    def _copy_code(self, index: int, block: int) -> None:
        blocks = self._message(index).code_blocks if index < len(self._messages) else []
        if block < len(blocks):
            QGuiApplication.clipboard().setText(blocks[block])
            self.code_copied.emit()

    # -- following the end ------------------------------------------------------------------------

    def following(self) -> bool:
        """True while the view keeps the end of the transcript in sight (the user has not scrolled up)."""
        return self._follow

    def follow_end(self) -> None:
        """Scroll to the end and keep it in sight (a message is being sent)."""
        self._follow = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    @Slot(int)
    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 4
        if value <= self.viewport().height() and self._first > 0 and not self._older_timer.isActive():
            self._older_timer.start()

    # -- rendering --------------------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange):  # colours, code's columns
            self._apply_palette()
            self._reset_document()
            self._render_older_step(fill_only=True)

    def _apply_palette(self) -> None:
        base = DARK if is_dark(self.palette()) else LIGHT
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        code_font = QFont(self.font())  # the size code is shown at: the document's, in the mono family
        code_font.setFamily(mono)
        column = QFontMetricsF(code_font).horizontalAdvance(" ")
        self.setTabStopDistance(TAB_COLUMNS * column)
        self._colours = Palette(**{**base.__dict__, "mono_family": mono, "mono_column_px": column})
        self._backgrounds = _BACKGROUNDS[base]
        self._renderer = MarkdownRenderer(self._colours)

    def _reset_document(self) -> None:
        """An empty document: nothing rendered yet, the newest messages come first."""
        self._older_timer.stop()
        if self._reply is not None and self._reply >= len(self._messages):
            self._render_timer.stop()
            self._reply = None
        self._stream = None
        self.clear()
        self._frames = []
        self._first = len(self._messages)

    @Slot()
    def _render_older_step(self, fill_only: bool = False) -> None:
        """Render older messages (newest first) for STEP_BUDGET_S; when filling, stop once the view
        and one more screen are full, else continue on the next turn while the user is near the top."""
        started = time.perf_counter()
        bar = self.verticalScrollBar()
        from_bottom = bar.maximum() - bar.value()
        while self._first > 0 and time.perf_counter() - started < STEP_BUDGET_S:
            self._prepend_frame(self._first - 1)
            if fill_only and self._laid_out_height() > 2 * self.viewport().height() + 200:
                break
        if not self._follow:
            bar.setValue(bar.maximum() - from_bottom)
        self._update_older_note()
        near_top = bar.value() <= self.viewport().height()
        if self._first > 0 and (near_top or (fill_only and self._laid_out_height()
                                             <= 2 * self.viewport().height() + 200)):
            self._older_timer.start()

    def _laid_out_height(self) -> float:
        return self.document().size().height()

    def _update_older_note(self) -> None:
        """The first block of the document says how many older messages are not shown yet."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.Start)
        cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
        text = (f"↑ {self._first} earlier message{'s' if self._first > 1 else ''}: scroll up to see them"
                if self._first else "")
        if cursor.selectedText() != text:
            fmt = cursor.charFormat()
            fmt.setForeground(QColor(self._colours.muted))
            cursor.insertText(text, fmt)

    def _frame_format(self, role: str) -> QTextFrameFormat:
        fmt = QTextFrameFormat()
        fmt.setBackground(QColor(self._backgrounds.get(role, self._backgrounds["assistant"])))
        fmt.setPadding(8)
        fmt.setBorder(0)
        fmt.setBottomMargin(6)
        return fmt

    def _append_frame(self, index: int) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame = cursor.insertFrame(self._frame_format(self._message(index).role))
        self._frames.append(frame)
        self._fill(frame, index)

    def _prepend_frame(self, index: int) -> None:
        """The frame of messages[index] before every rendered one (index == self._first - 1)."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.Start)
        cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock)
        frame = cursor.insertFrame(self._frame_format(self._message(index).role))
        self._frames.insert(0, frame)
        self._first = index
        self._fill(frame, index)

    def set_left_out(self, n: int) -> None:
        """The first ``n`` messages were dropped to fit the context: they are greyed and say so."""
        old, self._left_out = self._left_out, n
        for index in range(min(old, n), min(max(old, n), len(self._messages))):
            self._rerender(index)

    def left_out(self) -> int:
        return self._left_out

    def _rerender(self, index: int) -> None:
        if index >= self._first:
            self._fill(self._frames[index - self._first], index)

    def _fill(self, frame: QTextFrame, index: int) -> None:
        """(Re)write a message's frame: role label, body, note; the streaming reply gets its label
        and an empty sub-frame that _render_reply fills."""
        message = self._message(index)
        left_out = index < self._left_out
        head = self._head_html(message, left_out)
        if index != self._reply:
            self._fill_html(frame, head + self._body_html(message, index) + self._footer_html(message),
                            muted=left_out)
            return
        self._fill_html(frame, head)
        cursor = QTextCursor(self.document())
        cursor.setPosition(frame.lastPosition())
        self._stream = _Stream(cursor.insertFrame(QTextFrameFormat()))
        message.code_blocks = []
        self._render_reply()

    def _fill_html(self, frame: QTextFrame, html: str, muted: bool = False) -> None:
        cursor = frame.firstCursorPosition()
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        colour = self._colours.muted if muted else self._colours.text
        cursor.insertHtml(f'<div style="color:{colour}">{html}</div>')

    def _head_html(self, message: _Message, left_out: bool = False) -> str:
        label = ROLE_LABELS.get(message.role, message.role)
        if left_out:
            label += " · left out of the context (dropped to make room)"
        return (f'<p style="color:{self._colours.muted}; font-size: small; font-weight: bold; '
                f'margin-bottom: 6px">{label}</p>')

    def _body_html(self, message: _Message, index: int) -> str:
        tools = "".join(self._tool_html(message, index, k) for k in range(len(message.tools)))
        if message.role == "tool" or (message.tools and not message.text and not message.markers):
            return tools  # a tool's output is shown in its block
        if message.role == "assistant" and len(message.text) <= PLAIN_OVER_CHARS:
            rendered = self._renderer.render(message.text, index, message.markers)
            message.code_blocks = rendered.code_blocks
            return rendered.html + tools
        return self._renderer.plain(message.text, message.markers) + tools

    def _tool_html(self, message: _Message, index: int, k: int) -> str:
        """A tool block: its line, a link that shows or hides it; when shown, its text as typed."""
        c, block, expanded = self._colours, message.tools[k], k in message.expanded
        sign = _EXPANDED if expanded else _COLLAPSED
        head = (f'<p style="margin-top: 4px"><a href="{TOOL_SCHEME}:{index}/{k}" '
                f'style="color:{c.link}; text-decoration: none">{sign} {html.escape(block.title)}</a></p>')
        if not expanded:
            return head
        text = html.escape(block.text) if block.text else "<i>(empty)</i>"
        return (head + f'<p style="white-space: pre-wrap; font-family: \'{c.mono_family}\'; '
                f'background-color:{c.code_background}; margin-left: 12px">{text}</p>')

    def _footer_html(self, message: _Message) -> str:
        c = self._colours
        lines = "".join(f'<p style="color:{c.marker}; font-style: italic; font-size: small">'
                        f"{_escape(line)}</p>" for line in message.lines)
        note = (f'<p style="color:{c.muted}; font-style: italic; font-size: small">'
                f"{_escape(message.note)}</p>") if message.note else ""
        stats = (f'<p style="color:{c.muted}; font-size: small">{_escape(message.stats)}</p>'
                 if message.stats else "")
        return lines + stats + note


def _message(turn: Mapping[str, Any], markers: list[tuple[int, str]]) -> _Message:
    """A message whose markers at or past its end are lines under it, the others inline; in the order
    they came at one place (not by their words). A reply's tool calls, a tool's result: its blocks."""
    role, text = turn["role"], turn["content"]
    inside = [(offset, label) for offset, label in markers if offset < len(text)]
    lines = [label for offset, label in sorted(markers, key=lambda m: m[0]) if offset >= len(text)]
    message = _Message(role, text, inside, lines)
    if role == "tool":
        note = tool_result_note(turn)
        title = f"Tool result: {tool_result_label(turn)}" + (f" · {note}" if note else "")
        message.tools = [_ToolBlock(title, text)]
    else:
        message.tools = _call_blocks(tool_calls_of(turn))
    return message


def _call_blocks(tool_calls: Sequence[Mapping[str, Any]]) -> list[_ToolBlock]:
    return [_ToolBlock(f"Tool call: {tool_label(call['function']['name'])}",
                       pretty_arguments(call["function"]["arguments"])) for call in tool_calls]


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
