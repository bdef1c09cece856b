"""Conversations never lost, duplicated or hidden: syncs that append or compare-and-swap, creation by
uid, two real processes on one database, the one database owner, imports the list can always show,
leftover clean-up counted honestly, owner-only files, a read-only data folder."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lazykv.core.history import connection, snapshot_budget
from lazykv.core.history.records import (
    Change,
    ConversationNotFound,
    StoreError,
    StoreReadOnlyError,
    TranscriptConflict,
    new_uid,
)
from lazykv.core.history.store import Database, Store
from tests.support.history import append_message, create_conversation, snapshot_bytes, stored_messages

ROOT = Path(__file__).resolve().parents[2]


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


# --- sync: append or compare and swap ----------------------------------------------------------------


def test_a_new_chat_synced_twice_before_either_answer_is_one_conversation(store: Store) -> None:
    uid = new_uid()
    first = [turn("user", "hi")]
    both = [*first, turn("assistant", "hello")]
    a = store.sync_transcript(uid, first, 0, title="hi", create=True)
    b = store.sync_transcript(uid, both, 0, title="hi", create=True)  # queued before a's answer
    assert a.created and not b.created and a.id == b.id
    assert [s.id for s in store.list_conversations()] == [a.id]
    assert stored_messages(store, a.id) == both and not b.merged


def test_sync_appends_after_another_windows_turns_and_loses_none(store: Store) -> None:
    uid = new_uid()
    base = store.sync_transcript(uid, [turn("user", "q1"), turn("assistant", "a1")], 0, create=True)
    ours = [*base.messages, turn("user", "ours"), turn("assistant", "ours back")]
    theirs = [*base.messages, turn("user", "theirs"), turn("assistant", "theirs back")]
    store.sync_transcript(uid, theirs, len(base.messages))
    result = store.sync_transcript(uid, ours, len(base.messages))
    contents = [m["content"] for m in stored_messages(store, result.id)]
    assert contents == ["q1", "a1", "theirs", "theirs back", "ours", "ours back"]
    assert result.merged and result.messages == stored_messages(store, result.id)


def test_an_edit_is_compare_and_swap(store: Store) -> None:
    uid = new_uid()
    saved = store.sync_transcript(uid, [turn("user", "one"), turn("assistant", "two")], 0, create=True)
    edited = [turn("user", "one, edited")]
    result = store.sync_transcript(uid, edited, len(saved.messages))
    assert stored_messages(store, result.id) == edited and result.touches(Change.TRANSCRIPT, result.id)
    store.sync_transcript(uid, [*edited, turn("assistant", "from the other window")], 1)
    with pytest.raises(TranscriptConflict, match="another LazyKV Chat window"):
        store.sync_transcript(uid, [turn("user", "edited again")], 1)  # we still think 1 is stored
    stored = [m["content"] for m in stored_messages(store, result.id)]
    assert stored == ["one, edited", "from the other window"]


def test_a_refused_turn_is_taken_back_from_the_store(store: Store) -> None:
    uid = new_uid()
    kept = [turn("user", "q"), turn("assistant", "a")]
    saved = store.sync_transcript(uid, [*kept, turn("user", "x" * 2_000_000)], 0, create=True)
    result = store.sync_transcript(uid, kept, len(saved.messages))  # the window took it back
    assert stored_messages(store, result.id) == kept and store.search("xxxx") == []


def test_a_deleted_conversation_is_not_resurrected_by_a_late_sync(store: Store) -> None:
    uid = new_uid()
    saved = store.sync_transcript(uid, [turn("user", "q")], 0, create=True)
    store.delete(saved.id)
    with pytest.raises(ConversationNotFound, match="no longer exists"):
        store.sync_transcript(uid, [turn("user", "q"), turn("user", "more")], 1)
    assert store.list_conversations() == []


def test_an_unchanged_sync_changes_nothing(store: Store) -> None:
    uid = new_uid()
    saved = store.sync_transcript(uid, [turn("user", "q")], 0, create=True, settings={"a": 1})
    updated = store.conversation(saved.id).updated
    again = store.sync_transcript(uid, saved.messages, 1, settings={"a": 1})
    assert again.empty and store.conversation(saved.id).updated == updated


def test_two_processes_on_one_conversation_lose_no_turn(tmp_path: Path) -> None:
    db, snaps = tmp_path / "c.sqlite3", tmp_path / "snapshots"
    Store(db, snaps).close()
    uid, n = new_uid(), 40
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), str(ROOT)])}
    children = [
        subprocess.Popen([sys.executable, "-m", "tests.support.store_writer", str(db), str(snaps), uid, name,
                          str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for name in ("A", "B")
    ]  # fmt: skip
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in outputs]
    confirmed = [line.split(" ", 1)[1] for out, _ in outputs for line in out.splitlines()]
    assert len(confirmed) == 2 * 2 * n  # every turn of both was confirmed (no conflict: they only append)
    store = Store(db, snaps)
    try:
        [conv] = store.list_conversations()  # the scratch ones were deleted
        assert store.conversation(conv.id).uid == uid
        stored = [m["content"] for m in stored_messages(store, conv.id)]
        assert sorted(stored) == sorted(confirmed)  # none lost, none twice
        for name in ("A", "B"):
            mine = [c for c in stored if c.startswith(name)]
            assert mine == [f"{name} {verb} {i}" for i in range(n) for verb in ("asks", "hears")]
        assert [s.title for s in store.list_conversations()] == ["New chat"]  # scratch ones deleted
    finally:
        store.close()


def test_concurrent_creation_of_one_new_chat_from_two_processes_is_one_conversation(tmp_path: Path) -> None:
    db, snaps = tmp_path / "c.sqlite3", tmp_path / "snapshots"
    Store(db, snaps).close()
    uid = new_uid()
    script = (
        "import sys; from lazykv.core.history.store import Store\n"
        "s = Store(sys.argv[1], sys.argv[2], busy_timeout_ms=5000)\n"
        "m = [{'role': 'user', 'content': 'hello'}]\n"
        "print(s.sync_transcript(sys.argv[3], m, 0, create=True).id)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "app")}
    children = [subprocess.Popen([sys.executable, "-c", script, str(db), str(snaps), uid],
                                 stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]  # fmt: skip
    ids = {child.communicate(timeout=60)[0].strip() for child in children}
    store = Store(db, snaps)
    try:
        assert len(ids) == 1 and len(store.list_conversations()) == 1
        assert stored_messages(store, int(ids.pop())) == [turn("user", "hello")]
    finally:
        store.close()


# --- the one database owner --------------------------------------------------------------------------


def test_the_database_runs_every_operation_on_its_one_thread_and_connection(tmp_path: Path) -> None:
    opened: list[Store] = []

    def opener(path: Path, snapshots: Path) -> Store:
        opened.append(Store(path, snapshots))
        return opened[-1]

    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps", opener=opener)
    threads: set[int] = set()

    def write(i: int) -> int:
        def op(s: Store) -> int:
            threads.add(threading.get_ident())
            return s.sync_transcript(new_uid(), [turn("user", f"m{i}")], 0, create=True).id

        return db.call(op)

    with ThreadPoolExecutor(8) as pool:  # the GUI thread, the engine thread, ...: never "locked"
        ids = list(pool.map(write, range(64)))
    assert len(set(ids)) == 64 and len(opened) == 1 and len(threads) == 1
    nested = db.call(lambda s: db.call(lambda inner: inner is s))  # on the thread: runs in place
    assert nested is True
    assert db.close(timeout=10) and db.in_flight == 0
    with pytest.raises(StoreError, match="closed"):
        db.submit(lambda s: None).result()
    assert db.set_key(None).exception() is not None and db.in_flight == 0


def test_the_database_counts_operations_in_flight_and_reports_their_errors(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    gate = threading.Event()
    blocked = db.submit(lambda s: gate.wait(10))
    failing = db.submit(lambda s: s.conversation(12345))
    assert db.in_flight == 2
    gate.set()
    assert blocked.result(10) is True
    with pytest.raises(ConversationNotFound):
        failing.result(10)
    deadline = time.monotonic() + 5
    while db.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert db.in_flight == 0
    db.close(timeout=10)


def test_a_database_that_cannot_open_fails_the_operation_and_tries_again(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"not a database at all\n" * 100)
    db = Database(path, tmp_path / "snaps")
    with pytest.raises(StoreError, match="damaged"):
        db.call(lambda s: s.list_conversations())
    path.unlink()
    assert db.call(lambda s: s.list_conversations()) == []
    db.close(timeout=10)


# --- imports and rows the list can always show ------------------------------------------------------


def _export(**change: object) -> dict:
    return {
        "format": "lazykv-conversation", "version": 1, "title": "t", "system_prompt": "", "settings": {},
        "messages": [turn("user", "hi")], "created": 1.0, "updated": 2.0,
    } | change  # fmt: skip


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"updated": 1e12}, "updated must be a time"),
        ({"created": 1e300}, "created must be a time"),
        ({"created": -1}, "created must be a time"),
        ({"title": "bad \ud800 title"}, "title is not valid Unicode"),
        ({"system_prompt": "\udfff"}, "system_prompt is not valid Unicode"),
        ({"messages": [turn("user", "lone \ud83d surrogate")]}, "message 1: content is not valid Unicode"),
        ({"settings": {"k": "\ud800"}}, "settings is not valid Unicode"),
    ],
)
def test_an_import_the_list_could_not_show_is_refused(store: Store, change: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        store.import_json(_export(**change))
    assert store.list_conversations() == []


def test_an_imported_title_is_one_line(store: Store) -> None:
    conv = store.import_json(_export(title="  two\nlines\tand   spaces ")).id
    assert store.conversation(conv).title == "two lines and spaces"


def test_a_poisoned_row_of_an_older_version_is_repaired_and_never_hides_the_others(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)  # a version-1 database, as the last release wrote it
    connection.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('fine', 10, 20)")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('poisoned', 5, 1e12)")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('text time', 'x', 'y')")
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        summaries = {s.title: s for s in store.list_conversations()}
        assert set(summaries) == {"fine", "poisoned", "text time"}
        assert (summaries["poisoned"].created, summaries["poisoned"].updated) == (5.0, 5.0)
        assert (summaries["text time"].created, summaries["text time"].updated) == (0.0, 0.0)
        assert len({store.conversation(s.id).uid for s in summaries.values()}) == 3
    finally:
        store.close()


def test_a_damaged_row_read_today_still_shows(store: Store) -> None:
    conv = create_conversation(store, "damaged later")
    store._db.execute("UPDATE conversations SET updated = 1e12, settings = 'nope' WHERE id = ?", (conv,))
    [summary] = store.list_conversations()
    assert summary.updated == 0.0
    assert store.conversation(conv).settings == {}


# --- leftovers ------------------------------------------------------------------------------------


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_start_up_clean_up_removes_unfinished_saves_and_orphans_and_counts_them_apart(store: Store) -> None:
    snaps = store.snapshots_dir
    conv = create_conversation(store)
    referenced = "a" * 64
    (snaps / f"{referenced}.lkv").write_bytes(b"r" * 5)
    store.set_snapshot(conv, referenced, 5, 1, "{}")
    leftovers = {
        f".pending-{'1' * 32}.lkv.abc.tmp": 100,  # write_snapshot's temp file of a killed save
        f"pending-{'2' * 32}.lkv": 200,  # written, never renamed to its sha256
        f"{'b' * 64}.lkv": 300,  # renamed, never referenced
    }
    for name, size in leftovers.items():
        (snaps / name).write_bytes(b"x" * size)
        _age(snaps / name, 5)
    (snaps / "notes.txt").write_text("not ours")
    _age(snaps / "notes.txt", 5)
    assert store.clean_up(grace_s=60) == snapshot_budget.Cleanup()  # all younger than the grace
    cleanup = store.clean_up(grace_s=0)
    assert (cleanup.orphans, cleanup.unfinished, cleanup.freed_bytes) == (1, 2, 600)
    assert sorted(p.name for p in snaps.iterdir()) == sorted([f"{referenced}.lkv", "notes.txt"])


def test_prune_counts_leftovers_apart_from_pruned_snapshots(store: Store) -> None:
    (store.snapshots_dir / f"pending-{'3' * 32}.lkv").write_bytes(b"x")
    _age(store.snapshots_dir / f"pending-{'3' * 32}.lkv", 2 * snapshot_budget.ORPHAN_GRACE_S)
    result = store.prune_snapshots(10**9)
    assert result.pruned == [] and result.cleanup.unfinished == 1 and result.empty


def test_the_budget_never_prunes_the_snapshot_just_saved(store: Store) -> None:
    a, b = create_conversation(store), create_conversation(store)
    old, new = "c" * 64, "d" * 64
    for conv, digest, size in ((a, old, 100), (b, new, 150)):
        store.snapshot_path(digest).write_bytes(b"s" * size)
        store.set_snapshot(conv, digest, size, 1, "{}")
    result = store.prune_snapshots(149, keep=new)  # even alone it is over the budget
    assert result.pruned == [old] and store.conversation(b).snapshot is not None
    assert snapshot_bytes(store) == 150


# --- files and folders ----------------------------------------------------------------------------


def test_the_database_and_its_folders_are_the_owners_only(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    store = Store(data / "c.sqlite3", data / "snapshots")
    try:
        create_conversation(store, "x")
        for path in (data / "c.sqlite3", data / "c.sqlite3-wal", data / "c.sqlite3-shm"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        for path in (data, data / "snapshots"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    finally:
        store.close()


def test_an_existing_world_readable_database_is_made_the_owners_only(tmp_path: Path) -> None:
    Store(tmp_path / "c.sqlite3", tmp_path / "snaps").close()
    (tmp_path / "c.sqlite3").chmod(0o644)
    Store(tmp_path / "c.sqlite3", tmp_path / "snaps").close()
    assert stat.S_IMODE((tmp_path / "c.sqlite3").stat().st_mode) == 0o600


# --- a read-only data folder ------------------------------------------------------------------------


def test_a_read_only_data_folder_shows_the_history_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    conv = create_conversation(writer, "kept")
    append_message(writer, conv, "user", "still here")
    writer.close()
    monkeypatch.setattr(connection.os, "access", lambda path, mode: not mode & os.W_OK)
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        assert store.read_only and "read-only" in store.notice and "history is shown" in store.notice
        assert [s.title for s in store.list_conversations()] == ["kept"]
        assert stored_messages(store, conv) == [turn("user", "still here")]
        assert [s.id for s in store.search("still")] == [conv]
        with pytest.raises(StoreReadOnlyError, match="read-only"):
            append_message(store, conv, "user", "lost?")
        assert store.clean_up(0) == snapshot_budget.Cleanup()
    finally:
        store.close()


def test_a_read_only_folder_without_a_database_is_an_empty_read_only_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection.os, "access", lambda path, mode: not mode & os.W_OK)
    store = Store(tmp_path / "none.sqlite3", tmp_path / "snaps")
    try:
        assert store.read_only and store.list_conversations() == []
        assert not (tmp_path / "none.sqlite3").exists()
    finally:
        store.close()


def test_read_only_can_be_asked_for(tmp_path: Path) -> None:
    writer = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    create_conversation(writer, "kept")
    writer.close()
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps", read_only=True)
    try:
        assert [s.title for s in store.list_conversations()] == ["kept"]
        with pytest.raises(StoreReadOnlyError):
            create_conversation(store, "no")
    finally:
        store.close()
