"""Changing the key is atomic (issue 24.14): the history is re-encrypted and every snapshot's key
rewrapped under the new key, or nothing changes (the old key still opens everything, and the change
can be tried again), whichever step fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lazykv.core.history import connection
from lazykv.core.history.keys import UnlockedPassphrase
from lazykv.core.history.persistence import Crypto, Persistence
from lazykv.core.history.records import StoreLockedError, new_uid
from lazykv.core.history.snapshot import ENCRYPTION_KEYRING, ENCRYPTION_NONE, ENCRYPTION_PASSPHRASE
from lazykv.core.history.store import Database

OLD = Crypto(ENCRYPTION_KEYRING, bytes(range(32)))
NEW = Crypto(ENCRYPTION_PASSPHRASE, unlocked=UnlockedPassphrase(bytes(range(100, 132))))


def history(data: Path, crypto: Crypto) -> tuple[Database, dict[int, bytes]]:
    """A history under ``crypto`` with three conversations, each with a snapshot row and its own key."""
    db = Database(data / "c.sqlite3", data / "snapshots", key=crypto.database_key())
    keys = {}
    for i in range(3):
        conv = db.call(lambda s, i=i: s.sync_transcript(new_uid(), [{"role": "user", "content": f"turn {i}"}],
                                                        0, create=True)).id  # fmt: skip
        keys[conv] = os.urandom(32)
        sha = f"{i:02x}" * 32
        (data / "snapshots" / f"{sha}.lkv").write_bytes(b"file")
        db.call(lambda s, c=conv, sha=sha: s.set_snapshot(c, sha, 4, 1, "{}", crypto.wrap(keys[c], c)))
    return db, keys


def opens_under(data: Path, crypto: Crypto, keys: dict[int, bytes]) -> bool:
    """Whether the history opens with ``crypto``'s key and each snapshot key unwraps under it."""
    db = Database(data / "c.sqlite3", data / "snapshots", key=crypto.database_key())
    try:
        refs = {conv: db.call(lambda s, c=conv: s.conversation(c).snapshot) for conv in keys}
    except StoreLockedError:
        return False
    finally:
        db.close(10)
    return all(ref is not None and crypto.unwrap(ref.wrapped_key, conv) == keys[conv]
               for conv, ref in refs.items())  # fmt: skip


@pytest.mark.parametrize("where", ["second rewrap", "rename"])
def test_a_key_change_that_fails_midway_changes_nothing_and_can_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    db, keys = history(tmp_path, OLD)
    persistence = Persistence(db, object(), tmp_path / "f.json", OLD)  # type: ignore[arg-type]
    wraps = []
    real_wrap, real_replace = Crypto.wrap, os.replace

    def failing_wrap(crypto: Crypto, key: bytes, conv_id: int) -> bytes:
        wraps.append(conv_id)
        if len(wraps) == 2:
            raise RuntimeError("injected: the machine went down mid-way")
        return real_wrap(crypto, key, conv_id)

    def failing_replace(src: object, dst: object) -> None:
        if str(src).endswith(".encrypting"):
            raise OSError("injected: the rename failed")
        real_replace(src, dst)  # type: ignore[arg-type]

    if where == "rename":
        monkeypatch.setattr(connection.os, "replace", failing_replace)
    else:
        monkeypatch.setattr(Crypto, "wrap", failing_wrap)
    with pytest.raises((RuntimeError, OSError), match="injected"):
        persistence.change_crypto(NEW)
    monkeypatch.undo()
    assert persistence.crypto is OLD  # nothing changed: still the old key everywhere
    db.close(10)
    assert opens_under(tmp_path, OLD, keys) and not opens_under(tmp_path, NEW, keys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite3", "snapshots"]  # no side file left

    db = Database(tmp_path / "c.sqlite3", tmp_path / "snapshots", key=OLD.database_key())
    persistence = Persistence(db, object(), tmp_path / "f.json", OLD)  # type: ignore[arg-type]
    persistence.change_crypto(NEW)  # tried again: all of it
    assert persistence.crypto is NEW
    db.close(10)
    assert opens_under(tmp_path, NEW, keys) and not opens_under(tmp_path, OLD, keys)


def test_to_no_encryption_the_snapshot_keys_go_and_the_history_stays(tmp_path: Path) -> None:
    db, keys = history(tmp_path, OLD)
    persistence = Persistence(db, object(), tmp_path / "f.json", OLD)  # type: ignore[arg-type]
    persistence.change_crypto(Crypto(ENCRYPTION_NONE))
    assert all(db.call(lambda s, c=conv: s.conversation(c).snapshot) is None for conv in keys)
    assert [db.call(lambda s, c=conv: s.conversation(c).messages[0]["content"]) for conv in keys] == [
        "turn 0", "turn 1", "turn 2"]
    db.close(10)
