"""The conversation list is driven by changes (issue 16): an import, a delete and its undo, a rename
change only their own rows; the list is never rebuilt for them and keeps its scroll position. And
the operations in flight disable the delete that would race a snapshot being written."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from pytestqt.qtbot import QtBot

from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Store
from lazykv.core.paths import data_dir
from lazykv.qt.main_window import MainWindow
from lazykv.qt.worker import SaveSnapshot, Step
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, held, settle

KEPT_ROLE = Qt.ItemDataRole.UserRole + 7  # a mark the test puts on rows; a rebuilt row has none
N_CONVERSATIONS = 40


def listed_ids(w: MainWindow) -> list[int]:
    """The database's own order of the conversations."""
    return [s.id for s in w.database.call(lambda store: store.list_conversations())]


@dataclass
class Scrolled:
    """A window listing many saved conversations, its list scrolled half-way, every row marked."""

    w: MainWindow
    scrolled: int  # the scroll bar's value
    middle: int  # a conversation half-way down the list
    rebuilds: list[int] = field(default_factory=list)  # one entry each time the whole list is filled

    def assert_only_rows_changed(self, new: set[int]) -> None:
        """No rebuild, the database's order (rows added at their place), only ``new`` rows are new
        items, the scroll position kept."""
        panel = self.w.conversations_panel
        assert self.rebuilds == []
        assert panel.ids() == listed_ids(self.w)
        unmarked = {panel.list.item(r).data(Qt.ItemDataRole.UserRole) for r in range(panel.list.count())
                    if not panel.list.item(r).data(KEPT_ROLE)}  # fmt: skip
        assert unmarked == new
        assert panel.list.verticalScrollBar().value() == self.scrolled


def scrolled_window(qtbot: QtBot, fake_window: FakeWindow) -> Scrolled:
    w = fake_window()

    def fill(store: Store) -> None:
        for i in range(N_CONVERSATIONS):
            turns = [{"role": "user", "content": f"Conversation {i}"}]
            store.sync_transcript(new_uid(), turns, 0, title=f"Conversation {i}", create=True)

    w.database.call(fill)
    panel = w.conversations_panel
    with qtbot.waitSignal(panel.listed, timeout=WAIT_MS):
        w.conversations.refresh()
    assert panel.ids() == listed_ids(w)
    bar = panel.list.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 2, timeout=WAIT_MS)  # the list's layout is done later
    bar.setValue(bar.maximum() // 2)
    assert bar.value() > 0
    for row in range(panel.list.count()):
        panel.list.item(row).setData(KEPT_ROLE, True)
    s = Scrolled(w, bar.value(), panel.ids()[N_CONVERSATIONS // 2])
    panel.listed.connect(lambda: s.rebuilds.append(1))
    return s


def test_an_import_adds_one_row_and_rebuilds_nothing(
    qtbot: QtBot, fake_window: FakeWindow, tmp_path: Path
) -> None:
    s = scrolled_window(qtbot, fake_window)
    export = tmp_path / "c.json"
    export.write_text(json.dumps(s.w.database.call(lambda store: store.export_json(s.middle))))
    s.w.conversations.files.import_from(export)
    settle(qtbot, s.w)
    [imported] = set(s.w.conversations_panel.ids()) - set(range(N_CONVERSATIONS + 1))
    s.assert_only_rows_changed({imported})


def test_a_delete_and_its_undo_change_one_row_and_rebuild_nothing(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    s = scrolled_window(qtbot, fake_window)
    s.w.conversations.delete(s.middle)
    settle(qtbot, s.w)
    assert s.middle not in s.w.conversations_panel.ids()
    s.assert_only_rows_changed(set())
    s.w.conversations.undo_button.click()
    settle(qtbot, s.w)
    assert s.middle in s.w.conversations_panel.ids()  # back at its place (its id was free)
    s.assert_only_rows_changed({s.middle})


def test_a_rename_changes_its_row_in_place(qtbot: QtBot, fake_window: FakeWindow) -> None:
    s = scrolled_window(qtbot, fake_window)
    s.w.conversations.rename(s.middle, "Renamed")
    settle(qtbot, s.w)
    panel = s.w.conversations_panel
    assert panel.list.item(panel.ids().index(s.middle)).text().startswith("Renamed")
    s.assert_only_rows_changed(set())


def test_while_a_search_is_shown_an_undone_delete_that_matches_it_is_listed(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    s = scrolled_window(qtbot, fake_window)
    panel = s.w.conversations_panel
    s.w.conversations.rename(s.middle, "Pomegranate")
    with qtbot.waitSignal(panel.listed, timeout=WAIT_MS):
        panel.search.setText("pomegranate")
    assert panel.ids() == [s.middle]
    s.w.conversations.delete(s.middle)
    settle(qtbot, s.w)
    assert panel.ids() == []
    s.w.conversations.undo_button.click()
    settle(qtbot, s.w)
    assert panel.ids() == [s.middle]


def test_a_conversation_cannot_be_deleted_while_its_snapshot_is_written(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession
) -> None:
    """Issue 16: the count of operations in flight disables the one mutating action that races. A
    delete while the engine writes the conversation's snapshot left the file referenced by nothing
    and said the snapshot was not saved; the other actions queue on the one database thread."""
    w = fake_window()  # snapshots on, unencrypted
    chat(qtbot, w, "Keep my snapshot")
    conv = w.conversations.current
    held(qtbot, fake, lambda: w.engine.submit(Step()))  # the engine is busy: the save waits behind
    w.conversations.persist(snapshot=True)
    qtbot.waitUntil(lambda: any(isinstance(r, SaveSnapshot) for r in w.engine.pending()), timeout=WAIT_MS)
    panel = w.conversations_panel
    panel.select(conv)
    assert not panel.delete_button.isEnabled()
    [delete_key] = [s for s in panel.list.findChildren(QShortcut) if s.key() == QKeySequence.Delete]
    delete_key.activated.emit()  # the key is refused too
    assert panel.new_button.isEnabled() and panel.rename_button.isEnabled()  # they do not race
    fake.release()
    settle(qtbot, w)
    assert "not saved" not in w.statusBar().currentMessage()
    assert panel.delete_button.isEnabled() and conv in panel.ids()
    [snapshot] = (data_dir() / "snapshots").glob("*.lkv")  # the new one replaced the first
    assert w.database.call(lambda store: store.conversation(conv).snapshot.path) == snapshot
    panel.delete_button.click()
    settle(qtbot, w)
    assert conv not in panel.ids()


def _add_conversations(w: MainWindow, n: int) -> None:
    def fill(store: Store) -> None:
        for i in range(n):
            turns = [{"role": "user", "content": f"Filler {i}"}, {"role": "assistant", "content": "Noted."}]
            store.sync_transcript(new_uid(), turns, 0, title=f"Filler {i}", create=True)

    w.database.call(fill)


def _traced_second_turn(qtbot: QtBot, w: MainWindow) -> tuple[list[str], int]:
    """A new conversation's second turn: the SQL statements its saves ran, and the SQLite virtual
    machine's work for them (instructions run: the cost, whatever the machine's speed).
    FTS5 merges its index segments now and then as rows come, whatever the number of conversations:
    its automatic merges are off here, and each measurement starts from one merged segment."""
    statements: list[str] = []
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0  # go on

    def trace(store: Store, on: bool) -> None:
        store._db.set_trace_callback(statements.append if on else None)
        store._db.set_progress_handler(step if on else None, 1)

    def optimize(store: Store) -> None:
        for index in ("messages_fts", "titles_fts"):
            store._db.execute(f"INSERT INTO {index}({index}, rank) VALUES('automerge', 0)")
            store._db.execute(f"INSERT INTO {index}({index}) VALUES('optimize')")

    w.chat.new_chat()
    w.database.call(optimize)
    chat(qtbot, w, "First")
    w.database.call(lambda store: trace(store, True))
    try:
        chat(qtbot, w, "Second")
    finally:
        w.database.call(lambda store: trace(store, False))
    return statements, steps[0]


def test_saving_a_turn_reads_its_own_row_of_the_list_not_the_whole_list(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    """Issue 24, point 7: the row of each touched conversation was found in list_conversations(), so
    a turn's save cost O(all conversations)."""
    w = fake_window()
    _add_conversations(w, 20)
    small, small_steps = _traced_second_turn(qtbot, w)
    # (a branch's row joins its parent's by uid: issue 47)
    rows = [s for s in small if re.search(r"FROM conversations c( LEFT JOIN conversations p ON p\.uid = "
                                          r"c\.parent_uid)? WHERE c\.id = \d+$", s)]
    assert len(rows) == 2  # its own row, once per save: the user's message, then the reply
    _add_conversations(w, 200)
    large, large_steps = _traced_second_turn(qtbot, w)
    for statements in (small, large):  # the conversations table is only read by a conversation's key
        assert all(re.search(r"WHERE (c\.)?(id|uid) = ", s) for s in statements if "FROM conversations" in s)
    assert len(large) == len(small)  # the same statements, whatever the number of conversations
    assert large_steps <= 1.2 * small_steps, (small_steps, large_steps)
