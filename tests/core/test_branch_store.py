"""Branches in the conversation database (issue 47): made from a parent's first messages, linked to it by
uid, listed and found with the link, kept when the parent goes, exported and imported with the tree."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lazykv.core.chat.conversation import ReplyStats
from lazykv.core.history import connection
from lazykv.core.history.records import BranchLink, ConversationNotFound, new_uid
from lazykv.core.history.store import Store

TURNS = [{"role": "user", "content": "Tell me about otters"},
         {"role": "assistant", "content": "Otters swim."},
         {"role": "user", "content": "And beavers?"}, {"role": "assistant", "content": "Beavers build."}]


def parent(store: Store) -> tuple[int, str]:
    synced = store.sync_transcript(new_uid(), TURNS, 0, title="Rivers", system_prompt="Be brief.",
                                   settings={"kv_mode": "lazy"}, create=True)
    return synced.id, store.conversation(synced.id).uid


def branch(store: Store, parent_uid: str, n: int = 2) -> int:
    return store.create_branch(new_uid(), parent_uid, TURNS[:n], system_prompt="Be brief.",
                               settings={"kv_mode": "lazy"}, stats={1: ReplyStats(0.1, 9.0, 3)}).id


def test_a_branch_holds_the_first_messages_titled_and_linked_the_parent_unchanged(store: Store) -> None:
    pid, puid = parent(store)
    before = store.conversation(pid)
    bid = branch(store, puid)
    record = store.conversation(bid)
    assert record.title == "Rivers (branch)" and record.messages == TURNS[:2]
    assert record.system_prompt == "Be brief." and record.settings == {"kv_mode": "lazy"}
    assert record.stats == {1: ReplyStats(0.1, 9.0, 3)}
    assert record.branch == BranchLink(puid, "Rivers", 2, pid)
    assert store.conversation(pid) == before
    # a branch's branch says so once, and links to the branch
    bbid = store.create_branch(new_uid(), record.uid, TURNS[:1]).id
    assert store.conversation(bbid).title == "Rivers (branch)"
    assert store.conversation(bbid).branch == BranchLink(record.uid, "Rivers (branch)", 1, bid)
    with pytest.raises(ConversationNotFound):
        store.create_branch(new_uid(), new_uid(), TURNS[:1])
    assert len(store.list_conversations()) == 3


def test_the_list_and_search_carry_the_link_and_the_parents_title_as_it_is_now(store: Store) -> None:
    pid, puid = parent(store)
    bid = branch(store, puid)
    rows = {s.id: s for s in store.list_conversations()}
    assert rows[pid].branch is None and rows[bid].branch == BranchLink(puid, "Rivers", 2, pid)
    found = store.search("otters")
    assert {s.id for s in found} == {pid, bid}
    assert next(s for s in found if s.id == bid).branch == BranchLink(puid, "Rivers", 2, pid)
    assert [s.id for s in store.search("beavers")] == [pid]  # the branch holds only its first two
    changes = store.rename(pid, "Streams")
    assert changes.conv_ids == {pid, bid}  # the branch's row names its parent
    assert store.summary(bid).branch == BranchLink(puid, "Streams", 2, pid)


def test_deleting_a_parent_keeps_its_branches_and_an_undo_links_them_again(store: Store) -> None:
    pid, puid = parent(store)
    bid = branch(store, puid)
    deleted = store.delete(pid)
    assert deleted.conv_ids == {pid, bid}
    assert store.conversation(bid).messages == TURNS[:2]
    assert store.summary(bid).branch == BranchLink(puid, "Rivers", 2, None)  # gone: its title kept
    restored = store.undelete(deleted.record)
    assert restored.conv_ids == {pid, bid}
    assert store.summary(bid).branch == BranchLink(puid, "Rivers", 2, restored.id)
    # a deleted branch comes back with its link
    again = store.undelete(store.delete(bid).record)
    assert store.conversation(again.id).branch == BranchLink(puid, "Rivers", 2, pid)


def test_export_names_the_parent_and_import_keeps_the_tree_in_either_order(store: Store,
                                                                            tmp_path: Path) -> None:
    pid, puid = parent(store)
    bid = branch(store, puid)
    exported_parent, exported_branch = store.export_json(pid), store.export_json(bid)
    assert exported_branch["version"] == 3 and exported_parent["parent"] is None
    assert exported_branch["parent"] == {"uid": puid, "title": "Rivers", "at": 2}
    other = Store(tmp_path / "other.sqlite3", tmp_path / "other-snaps")
    try:
        b = other.import_json(json.loads(json.dumps(exported_branch))).id  # before its parent
        assert other.summary(b).branch == BranchLink(puid, "Rivers", 2, None)
        p = other.import_json(json.loads(json.dumps(exported_parent)))
        assert p.conv_ids == {p.id, b}  # the branch's row now shows it under its parent
        assert other.summary(b).branch == BranchLink(puid, "Rivers", 2, p.id)
        assert other.export_json(b) == exported_branch
    finally:
        other.close()
    # imported again into the same history: a new uid (its own is taken), the link still to the parent
    copy = store.import_json(exported_branch).id
    assert store.conversation(copy).uid != exported_branch["uid"]
    assert store.summary(copy).branch == BranchLink(puid, "Rivers", 2, pid)


def test_a_version_1_export_still_imports_as_a_conversation_without_a_parent(store: Store) -> None:
    old = {"format": "lazykv-conversation", "version": 1, "title": "t", "system_prompt": "", "settings": {},
           "messages": [{"role": "user", "content": "hi"}], "created": 1.0, "updated": 2.0}
    conv = store.import_json(old).id
    assert store.conversation(conv).branch is None and store.conversation(conv).messages == old["messages"]
    with pytest.raises(ValueError, match="unknown field.*parent"):
        store.import_json(old | {"parent": None})


@pytest.mark.parametrize(("parent_field", "error"), [
    ({"uid": "x", "title": "t", "at": 1}, "parent: uid must be a conversation uid"),
    ({"uid": "a" * 32, "title": "t", "at": 5}, "parent: at must be the number of messages"),
    ({"uid": "a" * 32, "title": "t", "at": True}, "parent: at must be"),
    ({"uid": "a" * 32, "title": "t"}, "parent must be null or an object with the fields at, title, uid"),
    ("a" * 32, "parent must be null or an object"),
])
def test_a_damaged_parent_in_an_import_is_refused_with_a_sentence(store: Store, parent_field: object,
                                                                    error: str) -> None:
    pid, puid = parent(store)
    data = store.export_json(branch(store, puid)) | {"parent": parent_field}
    with pytest.raises(ValueError, match=error):
        store.import_json(data)


def test_a_version_6_database_gets_the_link_columns_and_keeps_its_conversations(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(6):
        connection.MIGRATIONS[step](db)
    db.execute("PRAGMA user_version = 6")
    db.execute("INSERT INTO conversations (uid, title, created, updated) VALUES (?, 'old', 1, 2)",
               ("a" * 32,))
    db.execute("INSERT INTO messages (conv_id, seq, role, content) VALUES (1, 0, 'user', 'Hi')")
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == connection.SCHEMA_VERSION == 10
        assert store.conversation(1).branch is None and store.summary(1).branch is None
        bid = store.create_branch(new_uid(), "a" * 32, [{"role": "user", "content": "Hi"}]).id
        assert store.summary(bid).branch == BranchLink("a" * 32, "old", 1, 1)
    finally:
        store.close()
