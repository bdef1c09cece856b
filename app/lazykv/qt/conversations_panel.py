"""The conversation list: search, open, new, rename, delete, export, import, private mode.

The panel only shows and asks (signals); the window does the work off the GUI thread. The list's
current row is the chat on screen: a user's change of it by any means (a click, the arrow keys, Page
Down, a program setting it) asks to open that chat (``open_requested``); the window's own changes
(``select``, a row moved or removed) ask nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QPainter, QPalette, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.history.records import ConversationSummary
from lazykv.core.kinds import ExportFormat
from lazykv.qt.markdown import plain_rich_text

SEARCH_DELAY_MS = 250
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 1  # a row's ``updated`` time: the list's order
SUMMARY_ROLE = Qt.ItemDataRole.UserRole + 2  # the row's ConversationSummary
DEPTH_ROLE = Qt.ItemDataRole.UserRole + 3  # how deep a branch sits under its parent's row (0: a root)
INDENT_PX = 14  # a branch's row is indented this much per level under its parent's
MAX_INDENT_LEVELS = 4  # deeper branches are indented no further (the dock can be narrow)
EXPORTS = (("Export as Markdown…", ExportFormat.MARKDOWN), ("Export as JSON…", ExportFormat.JSON))


class ConversationsPanel(QWidget):
    open_requested = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int)
    delete_requested = Signal(int)
    export_requested = Signal(int, object)  # id, ExportFormat
    import_requested = Signal()
    search_changed = Signal(str)
    listed = Signal()  # the list was (re)filled
    private_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(lambda _: self._search_timer.start())

        self._saving: frozenset[int] = frozenset()  # conversations whose snapshot is being written
        self._quiet = 0  # > 0 while the panel itself changes the list: its current row opens nothing
        self._open_timer = QTimer(self)  # the row to open, asked once the key or click is handled
        self._open_timer.setSingleShot(True)
        self._open_timer.setInterval(0)
        self._open_timer.timeout.connect(self._open_current)
        self.list = QListWidget()
        self.list.setObjectName("conversation-list")
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.setWordWrap(True)
        self.list.setAlternatingRowColors(True)  # rows of two or three lines each: told apart
        self.list.setSpacing(1)
        self.list.setItemDelegate(_TreeDelegate(self.list))  # a branch indented under its parent
        self.list.itemActivated.connect(lambda _: self._open_timer.start())  # Enter, a double click
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        # F2 (rename) is the window's: it works from the message box too (issue 30)
        delete = QShortcut(QKeySequence(Qt.Key.Key_Delete), self.list,
                           context=Qt.ShortcutContext.WidgetShortcut)
        delete.activated.connect(lambda: self._with_selected(self._delete))

        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(self.new_requested.emit)
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(lambda: self._with_selected(self.rename_requested.emit))
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(lambda: self._with_selected(self._delete))
        self.more_button = QToolButton()
        self.more_button.setText("More")
        self.more_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        more = QMenu(self.more_button)
        for label, fmt in EXPORTS:
            more.addAction(label, lambda f=fmt: self._with_selected(
                lambda conv_id: self.export_requested.emit(conv_id, f)))
        more.addAction("Import JSON…", self.import_requested.emit)
        self.more_button.setMenu(more)
        self.private_box = QCheckBox("Private (save nothing)")
        self.private_box.setToolTip("While checked, this chat is neither written to disk nor snapshotted.")
        self.private_box.toggled.connect(self.private_toggled.emit)

        buttons = QGridLayout()  # two by two: the dock can be narrow and the transcript wide
        row = (self.new_button, self.rename_button, self.delete_button, self.more_button)
        for i, button in enumerate(row):
            buttons.addWidget(button, i // 2, i % 2)
        layout = QVBoxLayout(self)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.private_box)

    def set_conversations(self, items: Sequence[ConversationSummary], current: int | None) -> None:
        """Replace the whole list (start-up, a new search query); the scroll position is kept."""
        bar = self.list.verticalScrollBar()
        scrolled = bar.value()
        with self._changing():
            self.list.clear()
            for summary in items:
                self.list.addItem(_item(summary))
            self._arrange()
            self._tell_apart()
            self.select(current)
        bar.setValue(scrolled)
        self.listed.emit()

    def apply(self, rows: Mapping[int, ConversationSummary | None], current: int | None) -> None:
        """An operation's changes to the list (``Conversations.operation_did_execute``): each changed
        conversation's row as it is now, None when it is gone. Only those rows change; the others,
        and the scroll position, stay as they are; the current row stays the chat on screen."""
        with self._changing():
            shown = self.selected_id()
            for conv_id, summary in rows.items():
                if summary is None:
                    self.remove(conv_id)
                else:
                    self.upsert(summary, selected=conv_id == current)
            if shown is not None and self._row(shown) is None:  # its row went: Qt made a neighbour current
                self.select(current)

    def upsert(self, summary: ConversationSummary, selected: bool) -> None:
        """One conversation changed (a saved turn, a rename, an import, an undone delete): its row is
        updated, or added, at its place (most recently updated first). While a search is shown, a
        conversation not in its results is not added (it may not match)."""
        searching = bool(self.search.text().strip())
        row = self._row(summary.id)
        with self._changing():
            shown = self.selected_id()
            if row is None:
                if not searching:
                    self.list.addItem(_item(summary))
            else:
                _fill(self.list.item(row), summary)
            self._arrange()  # its place in the tree (a search's results keep the search's order)
            self._tell_apart()
            # the chat on screen's row, unless the user has just chosen another (it is being opened)
            self.select(summary.id if selected and not self._open_timer.isActive() else shown)

    def _arrange(self) -> None:
        """The rows as a tree (``tree_order``): each branch under its parent, indented; only rows out of
        place move. While a search is shown its results keep the search's order, none indented."""
        items = [self.list.item(i) for i in range(self.list.count())]
        summaries = [item.data(SUMMARY_ROLE) for item in items]
        searching = bool(self.search.text().strip())
        order = [(s, 0) for s in summaries] if searching else tree_order(summaries)
        depth = {s.id: d for s, d in order}
        for item in items:
            if item.data(DEPTH_ROLE) != depth[item.data(Qt.ItemDataRole.UserRole)]:
                item.setData(DEPTH_ROLE, depth[item.data(Qt.ItemDataRole.UserRole)])
        ids = [s.id for s in summaries]
        for place, (summary, _) in enumerate(order):
            if ids[place] != summary.id:
                row = ids.index(summary.id, place)
                self.list.insertItem(place, self.list.takeItem(row))  # the current row moves too
                ids.insert(place, ids.pop(row))

    def set_saving(self, conv_ids: Collection[int]) -> None:
        """The conversations whose snapshot is being written: they cannot be deleted until it is (the
        file would be left behind, referenced by nothing, and the save reported as failed)."""
        self._saving = frozenset(conv_ids)
        self._enable_delete()

    def _enable_delete(self) -> None:
        self.delete_button.setEnabled(self.selected_id() not in self._saving)

    def _delete(self, conv_id: int) -> None:
        if conv_id not in self._saving:
            self.delete_requested.emit(conv_id)

    def remove(self, conv_id: int) -> None:
        row = self._row(conv_id)
        if row is not None:
            with self._changing():
                self.list.takeItem(row)
                self._arrange()
                self._tell_apart()

    def _tell_apart(self) -> None:
        """Rows with the same title also show when each conversation was started (to the second)."""
        items = [self.list.item(i) for i in range(self.list.count())]
        def told(summary: ConversationSummary) -> tuple[str, str]:  # a branch's line tells it apart too
            return summary.title, branch_line(summary) if summary.branch is not None else ""

        titles = Counter(told(item.data(SUMMARY_ROLE)) for item in items)
        for item in items:
            summary = item.data(SUMMARY_ROLE)
            text = _item_text(summary, started=titles[told(summary)] > 1)
            if item.text() != text:
                item.setText(text)

    def title(self, conv_id: int) -> str | None:
        """The title the list shows for ``conv_id`` (None: not listed)."""
        row = self._row(conv_id)
        return None if row is None else self.list.item(row).data(SUMMARY_ROLE).title

    def select(self, conv_id: int | None) -> None:
        """Show ``conv_id`` (None: no row) as the chat on screen; this opens nothing."""
        row = self._row(conv_id) if conv_id is not None else None
        with self._changing():
            if row is None:
                self.list.clearSelection()
                self.list.setCurrentItem(None)
                return
            item = self.list.item(row)
            item.setSelected(True)
            self.list.setCurrentItem(item)

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """The panel changes the list itself (fills it, moves, removes or selects a row): a current row
        that changes meanwhile is no choice of the user's."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def _current_changed(self, *_: object) -> None:
        self._enable_delete()
        if not self._quiet and self.list.currentItem() is not None:
            # asked once the key press or click is handled, so that the window's answer (e.g. back to
            # the chat on screen while a reply streams) is the last word on the selection too; several
            # changes before then ask for the last row only
            self._open_timer.start()

    def _open_current(self) -> None:
        conv_id = self.selected_id()
        if conv_id is not None:
            self.open_requested.emit(conv_id)

    def _row(self, conv_id: int) -> int | None:
        return next((i for i, listed in enumerate(self.ids()) if listed == conv_id), None)

    def ids(self) -> list[int]:
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def selected_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def _with_selected(self, fn) -> None:  # noqa: ANN001 - a callable taking the id
        conv_id = self.selected_id()
        if conv_id is not None:
            fn(conv_id)

    def _context_menu(self, pos) -> None:  # noqa: ANN001 - QPoint
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Open", lambda: self.open_requested.emit(conv_id))
        link = item.data(SUMMARY_ROLE).branch
        if link is not None and link.parent_id is not None and self._row(link.parent_id) is not None:
            parent_id = link.parent_id
            menu.addAction(f"Open the parent, “{_short(link.parent_title)}”",
                           lambda: self.open_requested.emit(parent_id))
        menu.addAction("Rename…", lambda: self.rename_requested.emit(conv_id))
        menu.addAction("Delete", lambda: self._delete(conv_id)).setEnabled(conv_id not in self._saving)
        for label, fmt in EXPORTS:
            menu.addAction(label, lambda f=fmt: self.export_requested.emit(conv_id, f))
        menu.exec(self.list.viewport().mapToGlobal(pos))


def _item_text(summary: ConversationSummary, started: bool = False) -> str:
    plural = "" if summary.n_messages == 1 else "s"
    text = f"{summary.title}\n{_when(summary.updated)} · {summary.n_messages} message{plural}"
    if started:
        text += f" · started {_when(summary.created, '%Y-%m-%d %H:%M:%S')}"
    if summary.branch is not None:
        text += f"\n{branch_line(summary)}"
    return f"{text}\n{summary.snippet}" if summary.snippet else text


def branch_line(summary: ConversationSummary) -> str:
    """A branch's line in the list: where it came from, and whether that conversation is still there."""
    link = summary.branch
    assert link is not None
    gone = " (deleted)" if link.parent_id is None else ""
    return f"↳ branched from “{_short(link.parent_title)}”{gone} at message {link.at}"


def _short(title: str, chars: int = 40) -> str:
    return title if len(title) <= chars else title[: chars - 1] + "…"


def tree_order(summaries: Sequence[ConversationSummary]) -> list[tuple[ConversationSummary, int]]:
    """The list's rows as a tree, each with its depth: a branch right under its parent (when the parent is
    listed), the parents' trees ordered by their latest activity (a turn in any branch brings its whole
    tree up), siblings likewise; a tree's rows most recently updated first, then the newest id, as the
    database lists them. A branch whose parent is not listed (deleted) is a tree of its own."""
    by_id = {s.id: s for s in summaries}
    children: dict[int, list[ConversationSummary]] = defaultdict(list)
    for s in summaries:
        parent = s.branch.parent_id if s.branch is not None else None
        if parent is not None and parent in by_id and parent != s.id:
            children[parent].append(s)
    latest: dict[int, tuple[float, int]] = {}

    def activity(s: ConversationSummary, seen: frozenset[int] = frozenset()) -> tuple[float, int]:
        if s.id not in latest:
            inner = [activity(c, seen | {s.id}) for c in children[s.id] if c.id not in seen | {s.id}]
            latest[s.id] = max([(s.updated, s.id), *inner])
        return latest[s.id]

    order: list[tuple[ConversationSummary, int]] = []
    placed: set[int] = set()

    def place(s: ConversationSummary, depth: int) -> None:
        placed.add(s.id)
        order.append((s, depth))
        for child in sorted(children[s.id], key=activity, reverse=True):
            if child.id not in placed:
                place(child, depth + 1)

    roots = [s for s in summaries if s.branch is None or s.branch.parent_id not in by_id
             or s.branch.parent_id == s.id]
    for s in sorted(roots, key=activity, reverse=True):
        place(s, 0)
    for s in sorted(summaries, key=activity, reverse=True):  # links in a loop (a crafted import)
        if s.id not in placed:
            place(s, 0)
    return order


class _TreeDelegate(QStyledItemDelegate):
    """Paints a branch's row indented under its parent's, with a guide line to it."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        indent = _indent(index)
        if not indent:
            super().paint(painter, option, index)
            return
        rect = option.rect
        painter.save()
        painter.setPen(option.palette.color(QPalette.ColorRole.Mid))
        x = rect.left() + indent - INDENT_PX // 2
        y = rect.top() + min(rect.height() // 2, 12)
        painter.drawLine(x, rect.top(), x, y)
        painter.drawLine(x, y, rect.left() + indent - 2, y)
        painter.restore()
        shifted = QStyleOptionViewItem(option)
        shifted.rect = rect.adjusted(indent, 0, 0, 0)
        super().paint(painter, shifted, index)

    def sizeHint(self, option: QStyleOptionViewItem,  # noqa: N802 - Qt's name
                 index: QModelIndex | QPersistentModelIndex) -> QSize:
        indent = _indent(index)
        if not indent:
            return super().sizeHint(option, index)
        shifted = QStyleOptionViewItem(option)
        shifted.rect = option.rect.adjusted(indent, 0, 0, 0)  # the text wraps in what is left
        size = super().sizeHint(shifted, index)
        return QSize(size.width() + indent, size.height())


def _indent(index: QModelIndex | QPersistentModelIndex) -> int:
    depth = index.data(DEPTH_ROLE) or 0
    return INDENT_PX * min(int(depth), MAX_INDENT_LEVELS)


def _when(timestamp: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """The row's date; a time no calendar can show (a damaged or hostile row) never hides the list."""
    try:
        return dt.datetime.fromtimestamp(timestamp).strftime(fmt)
    except (OverflowError, OSError, ValueError):
        return "date unknown"


def _item(summary: ConversationSummary) -> QListWidgetItem:
    item = QListWidgetItem()
    item.setData(Qt.ItemDataRole.UserRole, summary.id)
    _fill(item, summary)
    return item


def _fill(item: QListWidgetItem, summary: ConversationSummary) -> None:
    item.setData(SUMMARY_ROLE, summary)
    item.setText(_item_text(summary))
    item.setToolTip(plain_rich_text(summary.snippet or summary.title))
    item.setData(UPDATED_ROLE, float(summary.updated))
