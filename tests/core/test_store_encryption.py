"""The conversation database encrypted at rest (SQLCipher): search works, a plain database is encrypted
in place crash-safely, a wrong or missing key is refused with a sentence, files stay owner-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lazykv.core.history import connection
from lazykv.core.history.keys import database_key
from lazykv.core.history.records import StoreLockedError, new_uid
from lazykv.core.history.store import Store
from tests.support.history import append_message, stored_messages

KEY = database_key(bytes(range(32)))
SECRET = "the secret word is pomegranate"


def _fill(store: Store) -> int:
    conv = store.sync_transcript(new_uid(), [{"role": "user", "content": SECRET}], 0, title="Fruit",
                                 create=True).id  # fmt: skip
    append_message(store, conv, "assistant", "noted")
    return conv


def _filled(tmp_path: Path, key: bytes | None = None) -> int:
    """A database at ``tmp_path`` holding one conversation, closed; the conversation's id."""
    with _opened(tmp_path, key) as store:
        return _fill(store)


@contextmanager
def _opened(tmp_path: Path, key: bytes | None = None) -> Iterator[Store]:
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=key)
    try:
        yield store
    finally:
        store.close()


def _all_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


def test_an_encrypted_database_keeps_no_plain_text_and_still_searches(tmp_path: Path) -> None:
    with _opened(tmp_path, KEY) as store:
        conv = _fill(store)
        assert [s.id for s in store.search("pomegr")] == [conv]  # full-text search, prefix included
        assert store.search("fruit")[0].snippet == "[Fruit]"
        assert b"pomegranate" not in _all_bytes(tmp_path) and b"SQLite format 3" not in _all_bytes(tmp_path)
        for path in tmp_path.glob("c.sqlite3*"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    with _opened(tmp_path, KEY) as again:
        assert stored_messages(again, conv)[0]["content"] == SECRET


def test_a_plain_database_is_encrypted_in_place(tmp_path: Path) -> None:
    conv = _filled(tmp_path)
    assert b"pomegranate" in (tmp_path / "c.sqlite3").read_bytes()
    with _opened(tmp_path, KEY) as store:
        record = store.conversation(conv)
        assert record.messages[0]["content"] == SECRET and record.title == "Fruit"
        assert [s.id for s in store.search("pomegranate")] == [conv]
        append_message(store, conv, "user", "after the migration")
    assert b"pomegranate" not in _all_bytes(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite3", "snaps"]


def test_a_crash_during_the_migration_leaves_the_plain_database_and_is_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _filled(tmp_path)
    before = (tmp_path / "c.sqlite3").read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(connection.os, "replace", crash)
    with pytest.raises(Exception, match="killed before the rename"):
        Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=KEY)
    monkeypatch.undo()
    assert (tmp_path / "c.sqlite3").read_bytes() == before  # untouched; the side file is a leftover
    with _opened(tmp_path, KEY) as store:
        assert stored_messages(store, conv)[0]["content"] == SECRET
    assert not (tmp_path / "c.sqlite3.encrypting").exists()


def test_a_wrong_or_missing_key_is_refused_with_a_sentence_and_changes_nothing(tmp_path: Path) -> None:
    Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=KEY).close()
    before = (tmp_path / "c.sqlite3").read_bytes()
    with pytest.raises(StoreLockedError, match="could not be unlocked with this key"):
        Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=database_key(bytes(32)))
    with pytest.raises(StoreLockedError, match="encrypted and no key was given"):
        Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    assert (tmp_path / "c.sqlite3").read_bytes() == before


def test_an_encrypted_database_opens_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conv = _filled(tmp_path, KEY)
    monkeypatch.setattr(connection.os, "access", lambda path, mode: not mode & os.W_OK)
    with _opened(tmp_path, KEY) as store:
        assert store.read_only and stored_messages(store, conv)[0]["content"] == SECRET


def test_the_database_owner_switches_to_the_key_in_order(tmp_path: Path) -> None:
    from lazykv.core.history.store import Database

    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        conv = db.call(_fill)
        db.set_key(KEY)  # queued: the next operation opens (and encrypts) with it
        assert db.call(lambda s: (s.encrypted, stored_messages(s, conv)[0]["content"])) == (True, SECRET)
        assert b"pomegranate" not in _all_bytes(tmp_path)
    finally:
        db.close(10)


def test_the_protection_can_change_keys_and_back_to_plain_in_place(tmp_path: Path) -> None:
    from lazykv.core.history.store import Database

    other = database_key(bytes(range(1, 33)))
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps", key=KEY)
    try:
        conv = db.call(_fill)
        db.change_key(other)  # e.g. keyring -> passphrase
        assert db.call(lambda s: stored_messages(s, conv)[0]["content"]) == SECRET
        with pytest.raises(StoreLockedError):
            Store(tmp_path / "c.sqlite3", tmp_path / "snaps", key=KEY)
        db.change_key(None)  # -> no encryption: the history is plain again
        assert db.call(lambda s: (s.encrypted, [x.id for x in s.search("pomegranate")])) == (False, [conv])
        assert (tmp_path / "c.sqlite3").read_bytes().startswith(b"SQLite format 3\x00")
    finally:
        db.close(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite3", "snaps"]


def test_a_plain_history_in_a_read_only_folder_is_shown_even_with_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _filled(tmp_path)
    monkeypatch.setattr(connection.os, "access", lambda path, mode: not mode & os.W_OK)
    with _opened(tmp_path, KEY) as store:
        assert store.read_only and not store.encrypted
        assert stored_messages(store, conv)[0]["content"] == SECRET
