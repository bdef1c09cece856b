"""The conversation database: conversations, messages, search, snapshot refs, export/import, failures."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazykv.core.chat.conversation import ReplyStats
from lazykv.core.history import connection
from lazykv.core.history.connection import SCHEMA_VERSION
from lazykv.core.history.records import (
    ConversationNotFound,
    ConversationRecord,
    StoreBusyError,
    StoreError,
    new_uid,
)
from lazykv.core.history.store import Store
from lazykv.core.paths import data_dir
from tests.support.history import (
    append_message,
    create_conversation,
    set_settings,
    set_system_prompt,
    snapshot_bytes,
    stored_messages,
)


def sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def write_snapshot(store: Store, name: str, size: int) -> str:
    digest = sha(name)
    store.snapshot_path(digest).write_bytes(b"k" * size)
    return digest


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_data_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAZYKV_DATA_DIR", str(tmp_path / "data"))
    assert data_dir() == tmp_path / "data"
    s = Store()
    try:
        assert s.path == tmp_path / "data" / "conversations.sqlite3"
        assert (tmp_path / "data" / "snapshots").is_dir()
    finally:
        s.close()


def test_new_database_is_wal_with_the_schema_version(store: Store) -> None:
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_reopening_keeps_everything(tmp_path: Path) -> None:
    first = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    conv = create_conversation(first, "kept")
    append_message(first, conv, "user", "hello")
    first.close()
    second = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    assert stored_messages(second, conv) == [{"role": "user", "content": "hello"}]
    second.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    Store(tmp_path / "c.sqlite3", tmp_path / "snaps").close()
    db = sqlite3.connect(tmp_path / "c.sqlite3")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer LazyKV Chat"):
        Store(tmp_path / "c.sqlite3", tmp_path / "snaps")


def test_create_and_list_most_recently_updated_first(store: Store) -> None:
    a = create_conversation(store, "alpha", system_prompt="be brief", settings={"temperature": 0.2})
    b = create_conversation(store)
    assert [s.id for s in store.list_conversations()] == [b, a]
    append_message(store, a, "user", "hi")
    summaries = store.list_conversations()
    assert [s.id for s in summaries] == [a, b]
    assert (summaries[0].title, summaries[0].n_messages, summaries[1].title) == ("alpha", 1, "New chat")
    assert summaries[0].updated > summaries[0].created
    record = store.conversation(a)
    assert (record.system_prompt, record.settings, record.snapshot) == (
        "be brief",
        {"temperature": 0.2},
        None,
    )


def test_missing_conversation_is_conversation_not_found_never_a_key_error(store: Store) -> None:
    calls = (store.conversation, store.delete, lambda i: store.rename(i, "x"), store.export_json,
             lambda i: store.set_snapshot(i, sha("x"), 1, 1, "{}"))
    for call in calls:
        with pytest.raises(ConversationNotFound, match="no longer exists") as caught:
            call(42)
        assert not isinstance(caught.value, KeyError) and caught.value.conv == 42


def test_append_and_edit_messages(store: Store) -> None:
    conv = create_conversation(store)
    append_message(store, conv, "user", "one")
    append_message(store, conv, "assistant", "two")
    append_message(store, conv, "user", "three")
    assert [m["content"] for m in stored_messages(store, conv)] == ["one", "two", "three"]
    before = store.conversation(conv)
    store.sync_transcript(before.uid, [{"role": "user", "content": "one, edited"}], synced=3)
    assert stored_messages(store, conv) == [{"role": "user", "content": "one, edited"}]
    assert store.conversation(conv).updated > before.updated
    append_message(store, conv, "assistant", "again")
    assert [m["content"] for m in stored_messages(store, conv)] == ["one, edited", "again"]


def test_bad_messages_are_refused_and_change_nothing(store: Store) -> None:
    conv = create_conversation(store)
    append_message(store, conv, "user", "kept")
    with pytest.raises(ValueError, match="role must be one of"):
        append_message(store, conv, "bot", "x")
    with pytest.raises(ValueError, match="message 2: content must be text"):
        store.sync_transcript(store.conversation(conv).uid,
                              [{"role": "user", "content": "a"}, {"role": "user", "content": 3}], 1)
    assert stored_messages(store, conv) == [{"role": "user", "content": "kept"}]


def test_rename_system_prompt_and_settings_round_trip(store: Store) -> None:
    conv = create_conversation(store)
    stamps = [store.conversation(conv).updated]
    store.rename(conv, "  Renamed  ")
    stamps.append(store.conversation(conv).updated)
    set_system_prompt(store, conv, "You are terse.")
    stamps.append(store.conversation(conv).updated)
    settings = {"model_path": "/m/x.gguf", "sampling": {"temperature": 0.7, "top_p": 0.9}, "kv_mode": "lazy"}
    set_settings(store, conv, settings)
    stamps.append(store.conversation(conv).updated)
    record = store.conversation(conv)
    assert (record.title, record.system_prompt, record.settings) == ("Renamed", "You are terse.", settings)
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert stamps[0] == stamps[1]  # a rename keeps the conversation's place in the list (issue 30)
    with pytest.raises(ValueError, match="not JSON"):
        set_settings(store, conv, {"bad": object()})


def test_search_finds_messages_and_titles_with_snippets(store: Store) -> None:
    trip = create_conversation(store, "Trip to Paris")
    append_message(store, trip, "user", "How tall is the Eiffel tower in Paris?")
    append_message(store, trip, "assistant", "About 330 metres.")
    cooking = create_conversation(store, "Soup")
    append_message(store, cooking, "user", "A recipe for onion soup, please")
    by_message = store.search("eiffel")
    assert [s.id for s in by_message] == [trip]
    assert "[Eiffel]" in by_message[0].snippet and by_message[0].n_messages == 2
    by_title = store.search("soup")
    assert [s.id for s in by_title] == [cooking] and "[soup]" in by_title[0].snippet
    only_title = store.search("trip")
    assert [s.id for s in only_title] == [trip] and only_title[0].snippet == "[Trip] to Paris"
    assert [s.id for s in store.search("oni")] == [cooking]  # the last word may be unfinished
    assert store.search("metres soup") == []  # every word must match in one message or title
    assert store.search("nothing-like-this") == []
    assert [s.id for s in store.search("   ")] == [s.id for s in store.list_conversations()]


def test_search_follows_edits_and_deletes(store: Store) -> None:
    conv = create_conversation(store, "Plain")
    append_message(store, conv, "user", "zebra")
    store.sync_transcript(store.conversation(conv).uid, [{"role": "user", "content": "giraffe"}], 1)
    assert store.search("zebra") == [] and [s.id for s in store.search("giraffe")] == [conv]
    store.rename(conv, "Savanna")
    assert store.search("plain") == [] and [s.id for s in store.search("savanna")] == [conv]
    store.delete(conv)
    assert store.search("giraffe") == [] and store.search("savanna") == []


@pytest.mark.parametrize(
    "query", ['"foo', "AND OR", "NOT", "title:x", "a*b", "(", "NEAR(a b)", "^x", "\x00", "-"]
)
def test_search_is_safe_for_query_syntax(store: Store, query: str) -> None:
    conv = create_conversation(store)
    append_message(store, conv, "user", 'say "foo" AND OR not')
    assert isinstance(store.search(query), list)
    assert [s.id for s in store.search('"foo')] == [conv]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=40))
def test_search_never_raises(store: Store, query: str) -> None:
    store.search(query)


def test_delete_then_undelete_restores_everything_with_the_same_id(store: Store) -> None:
    keep = create_conversation(store, "other")
    conv = create_conversation(store, "gone", system_prompt="sys", settings={"seed": 1})
    append_message(store, conv, "user", "q")
    append_message(store, conv, "assistant", "a")
    digest = write_snapshot(store, "s", 10)
    store.set_snapshot(conv, digest, 10, 5, '{"n_ctx": 512}')
    before = store.conversation(conv)
    record = store.delete(conv).record
    assert record == before
    with pytest.raises(ConversationNotFound):
        store.conversation(conv)
    assert [s.id for s in store.list_conversations()] == [keep]
    assert store.unreferenced(digest) and store.snapshot_path(digest).exists()  # undo can restore it
    newer = create_conversation(store, "created after the delete")
    assert newer != conv
    assert store.undelete(record).id == conv
    assert store.conversation(conv) == before
    assert [s.id for s in store.search("gone")] == [conv]


def test_undelete_takes_a_new_id_when_its_own_is_taken_and_drops_a_missing_snapshot(store: Store) -> None:
    conv = create_conversation(store, "twice")
    append_message(store, conv, "user", "hello")
    digest = write_snapshot(store, "s", 10)
    store.set_snapshot(conv, digest, 10, 5, "{}")
    record = store.delete(conv).record
    first = store.undelete(record).id
    store.snapshot_path(digest).unlink()
    second = store.undelete(record).id
    assert first == conv and second != conv
    assert stored_messages(store, second) == [{"role": "user", "content": "hello"}]
    assert store.conversation(second).snapshot is None


def test_snapshot_refs(store: Store) -> None:
    a = create_conversation(store)
    b = create_conversation(store)
    one, two = sha("one"), sha("two")
    assert store.set_snapshot(a, one, 100, 40, '{"v": 1}') is None
    ref = store.conversation(a).snapshot
    assert ref is not None
    assert (ref.sha256, ref.path, ref.size, ref.n_tokens, ref.header_json) == (
        one, store.snapshot_path(one), 100, 40, '{"v": 1}'
    )  # fmt: skip
    assert store.snapshot_path(one) == store.snapshots_dir / f"{one}.lkv"
    store.set_snapshot(b, one, 100, 40, "{}")
    assert store.set_snapshot(a, two, 50, 20, "{}") == one
    assert not store.unreferenced(one)  # b still uses it
    assert snapshot_bytes(store) == 150
    store.set_snapshot(b, two, 50, 20, "{}")
    assert store.unreferenced(one) and store.conversation(b).snapshot.sha256 == two
    assert snapshot_bytes(store) == 50  # counted once
    used = store.conversation(a).snapshot.last_used
    store.touch_snapshot(a)
    assert store.conversation(a).snapshot.last_used > used
    with pytest.raises(ValueError, match="sha256"):
        store.set_snapshot(a, "../../etc/passwd", 1, 1, "{}")


def test_snapshot_changes_do_not_reorder_conversations(store: Store) -> None:
    a = create_conversation(store)
    b = create_conversation(store)
    store.set_snapshot(a, sha("x"), 1, 1, "{}")
    store.touch_snapshot(a)
    assert [s.id for s in store.list_conversations()] == [b, a]


def test_prune_deletes_least_recently_used_files_and_keeps_transcripts(store: Store) -> None:
    convs = [create_conversation(store, f"c{i}") for i in range(4)]
    digests = []
    for i, conv in enumerate(convs):
        append_message(store, conv, "user", f"message {i}")
        digests.append(write_snapshot(store, f"s{i}", 100))
        store.set_snapshot(conv, digests[-1], 100, 10, "{}")
    store.touch_snapshot(convs[0])  # now the most recently used; convs[1] is the oldest
    assert store.prune_snapshots(400).pruned == []
    assert store.prune_snapshots(250).pruned == [digests[1], digests[2]]
    for i in (1, 2):
        assert not store.snapshot_path(digests[i]).exists()
        assert store.conversation(convs[i]).snapshot is None
        assert stored_messages(store, convs[i]) == [{"role": "user", "content": f"message {i}"}]
    for i in (0, 3):
        assert store.snapshot_path(digests[i]).exists() and store.conversation(convs[i]).snapshot
    assert snapshot_bytes(store) == 200
    assert store.prune_snapshots(0).pruned == [digests[3], digests[0]]
    assert snapshot_bytes(store) == 0 and list(store.snapshots_dir.iterdir()) == []


def test_a_shared_snapshot_counts_once_and_goes_for_all(store: Store) -> None:
    a, b = create_conversation(store), create_conversation(store)
    digest = write_snapshot(store, "shared", 100)
    store.set_snapshot(a, digest, 100, 1, "{}")
    store.set_snapshot(b, digest, 100, 1, "{}")
    assert snapshot_bytes(store) == 100
    assert store.prune_snapshots(99).pruned == [digest]
    assert store.conversation(a).snapshot is None and store.conversation(b).snapshot is None


def test_prune_removes_orphans_and_stale_temp_files(store: Store) -> None:
    conv = create_conversation(store)
    kept = write_snapshot(store, "kept", 10)
    store.set_snapshot(conv, kept, 10, 1, "{}")
    old_orphan = write_snapshot(store, "orphan", 10)
    age(store.snapshot_path(old_orphan), 3600)
    fresh_orphan = write_snapshot(store, "being written", 10)  # not referenced yet
    old_temp = store.snapshots_dir / "tmpabc123.tmp"
    old_temp.write_bytes(b"partial")
    age(old_temp, 2 * 3600)
    new_temp = store.snapshots_dir / ".snapshot-xyz.tmp"
    new_temp.write_bytes(b"partial")
    unrelated = store.snapshots_dir / "README.txt"
    unrelated.write_text("not ours to delete")
    age(unrelated, 2 * 3600)
    result = store.prune_snapshots(10**9)
    assert result.pruned == [] and (result.cleanup.orphans, result.cleanup.unfinished) == (1, 1)
    assert result.cleanup.freed_bytes == 10 + len(b"partial")
    remaining = {p.name for p in store.snapshots_dir.iterdir()}
    assert remaining == {f"{kept}.lkv", f"{fresh_orphan}.lkv", new_temp.name, unrelated.name}


def test_export_markdown(store: Store) -> None:
    conv = create_conversation(store, "Greetings", system_prompt="Be kind.")
    append_message(store, conv, "user", "Hello?")
    append_message(store, conv, "assistant", "Hi **there**.")
    text = store.export_markdown(conv)
    assert text.startswith("# Greetings\n")
    order = ["## System prompt\n\nBe kind.", "## User\n\nHello?", "## Assistant\n\nHi **there**."]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)


def test_export_json_and_import_round_trip(store: Store) -> None:
    conv = create_conversation(store, "Round trip", system_prompt="sys", settings={"top_k": 40})
    append_message(store, conv, "user", 'ünïcödé and "quotes"\nnewline')
    append_message(store, conv, "assistant", "ok")
    store.set_snapshot(conv, sha("s"), 10, 1, "{}")
    exported = store.export_json(conv)
    assert exported["format"] == "lazykv-conversation" and exported["version"] == 3
    assert "snapshot" not in json.dumps(exported)
    data = json.loads(json.dumps(exported))
    new = store.import_json(data).id
    assert new != conv
    assert store.export_json(new) == exported | {"uid": store.conversation(new).uid}  # its own is taken
    assert store.conversation(new).snapshot is None


def _valid() -> dict:
    return {
        "format": "lazykv-conversation", "version": 1, "title": "t", "system_prompt": "", "settings": {},
        "messages": [{"role": "user", "content": "hi"}], "created": 1.0, "updated": 2.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"format": "something-else"}, "not a LazyKV conversation"),
        ({"version": 4}, "unsupported conversation version 4"),
        ({"version": True}, "unsupported conversation version"),
        ({"title": None}, "title must be text"),
        ({"settings": []}, "settings must be an object"),
        ({"messages": {}}, "messages must be a list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "message 1: role must be one of"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]},
            "message 2: content",
        ),
        ({"messages": [{"role": "user", "content": None}]}, "content must be text"),
        ({"messages": [{"role": "user"}]}, "exactly the fields role and content"),
        ({"messages": ["hi"]}, "expected an object"),
        ({"created": "yesterday"}, "created must be a time"),
        ({"extra": 1}, "unknown field"),
    ],
)
def test_import_validates_strictly(store: Store, change: dict, error: str) -> None:
    data = _valid() | change
    with pytest.raises(ValueError, match=error):
        store.import_json(data)
    assert store.list_conversations() == []


def test_import_refuses_missing_fields_and_non_objects(store: Store) -> None:
    data = _valid()
    del data["messages"]
    with pytest.raises(ValueError, match="missing field.*messages"):
        store.import_json(data)
    with pytest.raises(ValueError, match="expected a JSON object"):
        store.import_json([1, 2])  # type: ignore[arg-type]
    assert store.import_json(_valid()).id > 0


def test_a_locked_database_raises_store_error(store: Store) -> None:
    conv = create_conversation(store, "before")
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        with pytest.raises(StoreBusyError, match="another LazyKV Chat is writing"):
            append_message(store, conv, "user", "blocked")
        assert time.monotonic() - started < 5
        assert stored_messages(store, conv) == []  # reading still works in WAL mode
    finally:
        other.execute("ROLLBACK")
        other.close()
    append_message(store, conv, "user", "after")
    assert stored_messages(store, conv) == [{"role": "user", "content": "after"}]


def test_a_second_store_on_the_same_file_sees_the_writes(store: Store) -> None:
    conv = create_conversation(store, "shared")
    other = Store(store.path, store.snapshots_dir)
    try:
        append_message(other, conv, "user", "from the other one")
        assert stored_messages(store, conv) == [{"role": "user", "content": "from the other one"}]
    finally:
        other.close()


def test_a_damaged_file_raises_store_error_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "conversations.sqlite3"
    garbage = b"this is not a database, just some bytes\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match="is damaged"):
        Store(path, tmp_path / "snapshots")
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conversations.sqlite3", "snapshots"]


def test_disk_full_raises_store_error_and_keeps_earlier_messages(store: Store) -> None:
    conv = create_conversation(store)
    append_message(store, conv, "user", "saved before the disk filled up")
    db = store._db  # the simulation needs the store's own connection: max_page_count is per connection
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StoreError, match="disk is full"):
        append_message(store, conv, "assistant", "x" * 200_000)
    with pytest.raises(StoreError, match="disk is full"):
        store.sync_transcript(store.conversation(conv).uid, [{"role": "user", "content": "y" * 200_000}], 1)
    assert stored_messages(store, conv) == [{"role": "user", "content": "saved before the disk filled up"}]
    db.execute("PRAGMA max_page_count = 1073741823")
    append_message(store, conv, "assistant", "fits again")
    assert len(stored_messages(store, conv)) == 2


def test_missing_fts5_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "_fts5_available", lambda: False)
    with pytest.raises(StoreError, match="FTS5"):
        Store(tmp_path / "c.sqlite3", tmp_path / "snaps")


def test_a_replys_stats_are_stored_with_it_and_come_back(store: Store) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "More"}, {"role": "assistant", "content": "Sure"}]
    first, second = ReplyStats(0.42, 31.5, 64), ReplyStats(1.5, None, 1)
    synced = store.sync_transcript(new_uid(), messages[:2], 0, create=True, stats={1: first})
    assert store.conversation(synced.id).stats == {1: first}
    store.sync_transcript(store.conversation(synced.id).uid, messages, 2, stats={1: first, 3: second})
    record = store.conversation(synced.id)
    assert record.stats == {1: first, 3: second}
    assert record.messages == messages  # the stats are not part of the messages (the engine's input)
    store._db.execute("UPDATE messages SET stats = 'damaged' WHERE seq = 1")
    assert store.conversation(synced.id).stats == {3: second}  # a damaged value reads as none
    restored = store.undelete(store.delete(synced.id).record)
    assert store.conversation(restored.id).stats == {3: second}


@contextlib.contextmanager
def migrated(tmp_path: Path, version: int) -> Iterator[tuple[Store, ConversationRecord]]:
    """A database of schema ``version`` as that release wrote it (one conversation: "Hi", "Hello"),
    opened by today's Store: it is migrated to the current version and keeps its messages."""
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(version):
        connection.MIGRATIONS[step](db)
    db.execute(f"PRAGMA user_version = {version}")
    db.execute("INSERT INTO conversations (uid, title, created, updated) VALUES (?, 'old', 1, 2)",
               ("a" * 32,))
    db.executemany("INSERT INTO messages (conv_id, seq, role, content) VALUES (1, ?, ?, ?)",
                   [(0, "user", "Hi"), (1, "assistant", "Hello")])
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        record = store.conversation(1)
        assert [m["content"] for m in record.messages] == ["Hi", "Hello"]
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        yield store, record
    finally:
        store.close()


def test_a_version_2_database_gets_the_stats_column_and_keeps_its_messages(tmp_path: Path) -> None:
    with migrated(tmp_path, 2) as (store, record):
        assert record.stats == {}
        store.sync_transcript(record.uid, record.messages, 2, stats={1: ReplyStats(0.1, 9.0, 12)})
        assert store.conversation(1).stats == {1: ReplyStats(0.1, 9.0, 12)}


def test_a_regenerated_replys_versions_are_stored_with_it_and_come_back(store: Store) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    synced = store.sync_transcript(new_uid(), messages, 0, create=True)
    uid = store.conversation(synced.id).uid
    assert store.conversation(synced.id).versions == {}
    again = [messages[0], {"role": "assistant", "content": "Hey"}]  # regenerated: the reply rewritten
    store.sync_transcript(uid, again, 2, versions={1: ["Hello", "Hey"]})
    record = store.conversation(synced.id)
    assert record.versions == {1: ["Hello", "Hey"]} and record.messages == again
    store.sync_transcript(uid, messages, 2, versions={1: ["Hello", "Hey"]})  # the first one chosen
    assert store.conversation(synced.id).messages == messages
    assert store.conversation(synced.id).versions == {1: ["Hello", "Hey"]}
    restored = store.undelete(store.delete(synced.id).record)
    assert store.conversation(restored.id).versions == {1: ["Hello", "Hey"]}
    store._db.execute("UPDATE messages SET versions = '{\"not\": 1}' WHERE seq = 1")
    assert store.conversation(restored.id).versions == {}  # a damaged value reads as none


def test_a_version_3_database_gets_the_versions_column_and_keeps_its_messages(tmp_path: Path) -> None:
    with migrated(tmp_path, 3) as (store, record):
        assert record.versions == {}
        store.sync_transcript(record.uid, record.messages, 2, versions={1: ["Hello", "Hi there"]})
        assert store.conversation(1).versions == {1: ["Hello", "Hi there"]}


def test_a_conversations_summary_is_its_row_of_the_list(store: Store) -> None:
    ids = [create_conversation(store, title=f"Chat {i}") for i in range(3)]
    append_message(store, ids[1], "user", "Hello")
    append_message(store, ids[1], "assistant", "Hi")
    for conv_id in ids:
        assert store.summary(conv_id) == next(s for s in store.list_conversations() if s.id == conv_id)
    assert store.summary(ids[1]).n_messages == 2
    store.delete(ids[0])
    assert store.summary(ids[0]) is None and store.summary(12345) is None


def test_a_version_4_database_gets_the_wrapped_key_column_and_its_snapshots_read_as_unkeyed(
    tmp_path: Path,
) -> None:
    with migrated(tmp_path, 4) as (store, record):
        assert record.snapshot is None
        (tmp_path / "snaps" / f"{'ab' * 32}.lkv").write_bytes(b"x")
        store.set_snapshot(1, "ab" * 32, 1, 1, "{}", b"w" * 60)
        ref = store.conversation(1).snapshot
        assert ref is not None and ref.wrapped_key == b"w" * 60
