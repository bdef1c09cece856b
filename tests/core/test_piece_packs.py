"""Snapshot pieces in packs: a save's new pieces are the records of one file, read back with one open per
pack; a pack goes with its last piece; a database of the earlier schema (a file per piece) still reads."""

from __future__ import annotations

import builtins
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from lazykv.core.history import connection, pieces
from lazykv.core.history.records import PieceRow, new_uid
from lazykv.core.history.store import Store

SHA = "ab" * 32


def _data(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_pieces_of_one_pack_are_read_with_one_open_and_each_is_authenticated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = [_data(5000 + 100 * i, i) for i in range(40)]
    keys = [os.urandom(32) for _ in data]
    addrs = [pieces.address(b"k" * 32, d) for d in data]
    spans = pieces.write_pack(tmp_path, "p.lkvp", list(zip(addrs, data, keys, strict=True)))
    assert len(list(tmp_path.iterdir())) == 1
    where = {a: pieces.Location(tmp_path / "p.lkvp", k, off, size)
             for a, k, (off, size) in zip(addrs, keys, spans, strict=True)}  # fmt: skip
    entries = [(a, len(d)) for a, d in zip(addrs, data, strict=True)][::-1]  # any order
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: opened.append(p) or real_open(p, *a, **k))
    assert bytes(pieces.assemble(entries, where.__getitem__)) == b"".join(data[::-1])
    assert len(opened) == 1
    monkeypatch.undo()
    raw = bytearray((tmp_path / "p.lkvp").read_bytes())
    raw[spans[7][0] + 40] ^= 1  # one record damaged: that piece, and only it, is refused
    (tmp_path / "p.lkvp").write_bytes(raw)
    with pytest.raises(pieces.PieceError) as refused:
        pieces.assemble(entries, where.__getitem__)
    assert refused.value.address == addrs[7]
    swapped = dict(where, **{addrs[3]: where[addrs[4]]})  # another piece's record in its place
    with pytest.raises(pieces.PieceError):
        pieces.assemble([(addrs[3], len(data[3]))], swapped.__getitem__)


def _conv(store: Store) -> int:
    return store.sync_transcript(new_uid(), [{"role": "user", "content": "Hi"}], 0, create=True).id


def test_a_pack_goes_with_its_last_piece_and_keeps_what_other_snapshots_hold(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        folder = store.pieces_dir
        folder.mkdir(parents=True, exist_ok=True)
        data = [_data(6000, i) for i in range(3)]
        addrs = [pieces.address(None, d) for d in data]
        name = "a" * 32 + ".lkvp"
        spans = pieces.write_pack(folder, name, [(a, d, None) for a, d in zip(addrs, data, strict=True)])
        rows = [PieceRow(a, name, size, None, off) for a, (off, size) in zip(addrs, spans, strict=True)]
        one, two = _conv(store), _conv(store)
        store.set_snapshot(one, SHA, 10, 1, "{}", None, (rows[0], rows[1]))
        store.set_snapshot(two, SHA, 10, 1, "{}", None, (rows[1], rows[2]))
        assert store.stored_bytes() == 10 + sum(r.size for r in rows)  # each piece once
        assert set(store.conversation(one).snapshot.pieces) == {rows[0], rows[1]}
        store.set_snapshot(one, SHA, 10, 1, "{}", None, ())  # piece 0 only it held: gone, the pack stays
        assert (folder / rows[0].file).is_file()
        assert store.piece_rows(addrs).keys() == {addrs[1], addrs[2]}
        where = {r.address: pieces.Location(folder / r.file, None, r.offset, r.size) for r in rows}
        assert bytes(pieces.assemble([(addrs[2], 6000)], where.__getitem__)) == data[2]
        store.set_snapshot(two, SHA, 10, 1, "{}", None, ())  # its last pieces: the pack goes
        assert not (folder / rows[0].file).exists()
        assert store.piece_rows(addrs) == {}
    finally:
        store.close()


def test_a_version_8_database_keeps_its_pieces_each_a_pack_of_one(tmp_path: Path) -> None:
    path, folder = tmp_path / "c.sqlite3", tmp_path / "snaps" / "pieces"
    folder.mkdir(parents=True)
    data = [_data(7000, i) for i in range(2)]
    addrs = [pieces.address(None, d) for d in data]
    sizes = [pieces.write_piece(folder, f"{i}" * 32 + ".lkvp", a, d, None)
             for i, (a, d) in enumerate(zip(addrs, data, strict=True))]  # fmt: skip
    db = sqlite3.connect(path, isolation_level=None)
    for step in range(8):
        connection.MIGRATIONS[step](db)
    db.execute("PRAGMA user_version = 8")
    db.execute("INSERT INTO conversations (uid, title, created, updated) VALUES (?, 'old', 1, 2)",
               ("a" * 32,))
    db.execute("INSERT INTO snapshots (conv_id, sha256, size, n_tokens, header_json, last_used)"
               " VALUES (1, ?, 10, 1, '{}', 1)", (SHA,))  # fmt: skip
    for i, a in enumerate(addrs):
        db.execute("INSERT INTO pieces (address, file, size) VALUES (?, ?, ?)", (a, f"{i}" * 32 + ".lkvp",
                                                                                  sizes[i]))  # fmt: skip
        db.execute("INSERT INTO snapshot_pieces (conv_id, address) VALUES (1, ?)", (a,))
    db.close()
    store = Store(path, tmp_path / "snaps")
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == connection.SCHEMA_VERSION == 10
        rows = store.conversation(1).snapshot.pieces
        wanted = {(a, 0, n) for a, n in zip(addrs, sizes, strict=True)}
        assert {(r.address, r.offset, r.size) for r in rows} == wanted
        where = {r.address: pieces.Location(folder / r.file, None, r.offset, r.size) for r in rows}
        assert bytes(pieces.assemble([(a, 7000) for a in addrs], where.__getitem__)) == b"".join(data)
        assert store._db.execute("PRAGMA foreign_key_check").fetchall() == []
        store.delete(1)  # the references still cascade and count: the pieces' rows go with the last one
        assert store.piece_rows(addrs) == {}
    finally:
        store.close()
