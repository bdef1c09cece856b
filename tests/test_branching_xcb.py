"""Branch from here (issue 47) with the real app, its real engine and SmolLM2 on Qt's xcb platform under
Xvfb and openbox: a chat of two exchanges is branched at its middle message by a right click on it and
the menu's "Branch from here"; the branch opens from the parent's cache (not re-read), a message sent in
it is answered, the parent is unchanged; after a relaunch both resume from their snapshots.

The scenarios are played by ``tests/support/xcb_app.py``'s driver; this module adds them to the driver's
scenarios when run as ``python -m tests.test_branching_xcb SCENARIO OUT.json -- [app arguments]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lazykv.core.settings import Settings
from tests.support.xcb_run import play


def branch_middle(d: Any) -> dict[str, Any]:
    """Two exchanges; a right click on the first reply, "Branch from here"; a message in the branch."""
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QContextMenuEvent, QTextCursor
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QMenu

    from tests.support.xcb_app import wait_until

    w = d.w
    d.model_loaded()
    d.settled()
    d.send("Name a colour.")
    d.send("Name a fruit.")
    parent = w.conversations.current
    parent_before = d.saved()[str(parent)]
    view = w.transcript
    frame = view._frames[1 - view._first]  # the first reply, laid out (the chat is short)
    cursor = QTextCursor(view.document())
    cursor.setPosition(frame.firstPosition() + 1)
    point = view.cursorRect(cursor).center()
    assert view.message_at(point) == 1, view.message_at(point)
    chosen: list[str] = []

    def choose() -> None:  # the menu the right click opened: "Branch from here"
        menu = QApplication.activePopupWidget()
        if not isinstance(menu, QMenu):
            QTimer.singleShot(50, choose)
            return
        action = next(a for a in menu.actions() if a.text() == "Branch from here")
        chosen.append(action.text())
        menu.hide()
        action.trigger()

    QTimer.singleShot(50, choose)
    # a right click's context-menu event (QTest's synthetic press makes none), at the message on screen
    QTest.mouseMove(view.viewport(), point)
    QApplication.sendEvent(view.viewport(), QContextMenuEvent(QContextMenuEvent.Reason.Mouse, point,
                                                              view.viewport().mapToGlobal(point)))
    wait_until(lambda: bool(chosen), "the message's menu", 10)
    wait_until(lambda: w.conversations.current not in (None, parent), "the branch on screen")
    d.settled()
    opened = {"screen": d.screen(), "kv_used": w.kv.n_cells_used if w.kv else None}
    branch = w.conversations.current
    sent = d.send("Name an animal.")
    return {"parent": parent, "branch": branch, "parent_before": parent_before, "opened": opened,
            "sent": sent, "after": d.screen(), "saved": d.saved(), "rows": _rows(w),
            "snapshots": _snapshots(w)}


def resume_both(d: Any) -> dict[str, Any]:
    """A relaunch: the parent and the branch opened from the list, each resumed (from its snapshot)."""
    from tests.support.xcb_app import wait_until

    w = d.w
    d.model_loaded()
    d.listed(2)
    d.settled()
    panel = w.conversations_panel
    rows = _rows(w)
    branch = next(conv_id for conv_id, _, depth, _ in rows if depth == 1)
    parent = next(conv_id for conv_id, _, depth, _ in rows if depth == 0)
    results = {}
    for conv_id in (parent, branch) if w.conversations.current != parent else (branch, parent):
        before = len(d.opened)
        d.click_row(conv_id)
        wait_until(lambda c=conv_id, b=before: any(i == c for i, _ in d.opened[b:]),
                   f"conversation {conv_id}")
        d.settled()
        result = next(r for i, r in d.opened[before:] if i == conv_id)
        results[str(conv_id)] = {"how": str(result.how), "note": result.note, "n_tokens": result.n_tokens,
                                 "screen": d.screen()}
    assert panel.selected_id() in (parent, branch)
    return {"parent": parent, "branch": branch, "rows": rows, "results": results}


def _rows(w: Any) -> list[tuple[int, str, int, str]]:
    from lazykv.qt.conversations_panel import DEPTH_ROLE, SUMMARY_ROLE

    items = [w.conversations_panel.list.item(i) for i in range(w.conversations_panel.list.count())]
    return [(i.data(SUMMARY_ROLE).id, i.data(SUMMARY_ROLE).title, i.data(DEPTH_ROLE) or 0, i.text())
            for i in items]


def _snapshots(w: Any) -> dict[str, int]:
    """The tokens of each conversation's saved snapshot, by id."""
    def read(store: Any) -> dict[str, int]:
        refs = {s.id: store.conversation(s.id).snapshot for s in store.list_conversations()}
        return {str(conv_id): ref.n_tokens for conv_id, ref in refs.items() if ref is not None}

    return w.database.call(read)


def _play(scenario: str, out: Path, smollm2_path: Path) -> tuple[dict[str, Any], str]:
    return play("tests.test_branching_xcb", scenario, out, ["--model", str(smollm2_path), "--ctx", "2048"])


def _contents(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "system"]


@pytest.mark.slow
def test_branch_at_the_middle_message_answers_and_both_resume_after_a_relaunch(
        tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings()
    for name, value in {"snapshot_encryption": "none", "max_reply_tokens": 12, "temperature": 0.0,
                        "idle_conversion": False}.items():
        settings.set(name, value)
    settings.save()

    seen, _ = _play("branch_middle", tmp_path / "branch.json", smollm2_path)
    parent, branch = seen["parent"], seen["branch"]
    opened = seen["opened"]["screen"]
    assert branch != parent and opened["current"] == opened["selected"] == branch
    first_two = _contents(seen["parent_before"])[:2]
    assert first_two[0] == "Name a colour." and _contents(opened["messages"]) == first_two
    assert opened["resume_note"].startswith("Branched from “Name a colour.” at message 2"), opened
    assert "Re-read" not in opened["resume_note"]
    assert 0 < seen["opened"]["kv_used"] < 200
    assert _contents(seen["sent"]["prompt"]) == [*first_two, "Name an animal."]
    assert seen["sent"]["n_reused"] > 0  # the branch's cache held its first two messages
    branch_saved = _contents(seen["saved"][str(branch)])
    assert branch_saved[:3] == [*first_two, "Name an animal."] and len(branch_saved) == 4
    assert branch_saved[3].strip(), "no reply"
    assert seen["saved"][str(parent)] == seen["parent_before"]  # the parent is unchanged
    assert [(conv_id, depth) for conv_id, _, depth, _ in seen["rows"]] == [(parent, 0), (branch, 1)]
    assert "branched from “Name a colour.” at message 2" in seen["rows"][1][3]
    assert set(seen["snapshots"]) == {str(parent), str(branch)}

    again, _ = _play("resume_both", tmp_path / "resume.json", smollm2_path)
    assert (again["parent"], again["branch"]) == (parent, branch)
    for conv_id in (parent, branch):
        result = again["results"][str(conv_id)]
        assert result["how"] == "restored", result
        assert result["screen"]["current"] == conv_id
        assert _contents(result["screen"]["messages"]) == _contents(seen["saved"][str(conv_id)])


if __name__ == "__main__":
    from tests.support import xcb_app

    xcb_app.SCENARIOS.update({f.__name__: f for f in (branch_middle, resume_both)})
    sys.exit(xcb_app.main(sys.argv[1:]))
