"""Deleting a conversation is a real deletion (issue 24.12): once its undo has passed, nothing it held
is left in any file of the data folder (the database, its WAL, the search index, its snapshot), in
every protection mode, the unencrypted one included; and the other conversations are intact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lazykv.core.history.keys import database_key
from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Database

MARKER = "Zqxmarker4711"  # one search token (no separator inside), found in no other text
KEY = bytes(range(32))
MODES = {"keyring": database_key(KEY), "passphrase": database_key(bytes(range(1, 33))), "none": None}


def files_holding(folder: Path, text: str) -> list[str]:
    """The files under ``folder`` whose bytes hold ``text`` as typed or as the search index keeps it
    (lower case)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if any(form.encode() in data for form in (text, text.lower())):
            found.append(str(path.relative_to(folder)))
    return found


def turns(words: str) -> list[dict[str, str]]:
    long = " ".join([words] * 400)  # past a page: the overflow pages too
    return [{"role": "user", "content": words}, {"role": "assistant", "content": f"About {words}: {long}"}]


@pytest.mark.parametrize("mode", list(MODES))
def test_a_deleted_conversation_leaves_nothing_in_any_file_once_erased(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "data"
    db = Database(data / "c.sqlite3", data / "snapshots", key=MODES[mode])
    try:
        kept = db.call(lambda s: s.sync_transcript(new_uid(), turns("giraffes are tall"), 0, create=True)).id
        gone = db.call(lambda s: s.sync_transcript(new_uid(), turns(f"the {MARKER} secret"), 0,
                                                   create=True)).id  # fmt: skip
        db.call(lambda s: s.rename(gone, f"Notes on {MARKER}"))
        sha = "ab" * 32
        snapshot = data / "snapshots" / f"{sha}.lkv"
        snapshot.write_bytes(b"snapshot of " + MARKER.encode())
        db.call(lambda s: s.set_snapshot(gone, sha, snapshot.stat().st_size, 1, "{}", os.urandom(60)))
        assert [hit.id for hit in db.call(lambda s: s.search(MARKER))] == [gone]
        deleted = db.call(lambda s: s.delete(gone))
        assert snapshot.exists()  # the undo can still put it back
        db.call(lambda s: s.erase(deleted.record))  # the undo has passed
        assert files_holding(data, MARKER) == []
        assert db.call(lambda s: s.search(MARKER)) == []
        assert [hit.id for hit in db.call(lambda s: s.search("giraffes"))] == [kept]
        assert db.call(lambda s: s.conversation(kept).messages) == turns("giraffes are tall")
    finally:
        db.close(10)
    assert files_holding(data, MARKER) == []


def test_an_undone_delete_keeps_its_snapshot_and_its_key(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snapshots", key=MODES["keyring"])
    try:
        conv = db.call(lambda s: s.sync_transcript(new_uid(), turns("kept"), 0, create=True)).id
        sha, wrapped = "cd" * 32, os.urandom(60)
        snapshot = tmp_path / "snapshots" / f"{sha}.lkv"
        snapshot.write_bytes(b"state")
        db.call(lambda s: s.set_snapshot(conv, sha, 5, 1, "{}", wrapped))
        deleted = db.call(lambda s: s.delete(conv))
        back = db.call(lambda s: s.undelete(deleted.record)).id
        db.call(lambda s: s.erase(deleted.record))  # a late erase of an undone delete changes nothing
        ref = db.call(lambda s: s.conversation(back).snapshot)
        assert snapshot.exists() and ref is not None and ref.wrapped_key == wrapped
    finally:
        db.close(10)


@pytest.mark.parametrize("mode", list(MODES))
def test_secure_delete_is_on(tmp_path: Path, mode: str) -> None:
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snapshots", key=MODES[mode])
    try:
        assert db.call(lambda s: s._db.execute("PRAGMA secure_delete").fetchone()[0]) == 1
    finally:
        db.close(10)
