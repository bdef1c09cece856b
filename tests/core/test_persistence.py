"""Snapshots through files, the database and encryption: resume exactly, or fall back to the transcript."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.history import snapshot
from lazykv.core.history.keys import Kdf, PassphraseLock
from lazykv.core.history.persistence import Crypto, OpenResult, Persistence
from lazykv.core.history.records import new_uid
from lazykv.core.history.snapshot import (
    ENCRYPTION_KEYRING,
    ENCRYPTION_NONE,
    ENCRYPTION_PASSPHRASE,
    FORMAT_VERSION,
    WHOLE_STATE_VERSION,
    Binding,
    SnapshotError,
    read_snapshot,
    transcript_digest,
    write_snapshot,
)
from lazykv.core.history.store import Database

GREEDY = SamplingSettings(temperature=0.0, seed=1)
SHORT = "Hello! Who are you?"
LONG = "Here is a list: " + ", ".join(f"item {i}" for i in range(120)) + ". Which item comes first?"
CASES = {"f16": ("f16", SHORT), "q8_0": ("q8_0", SHORT), "lazy-before": ("lazy", SHORT),
         "lazy-after": ("lazy", LONG)}
KEY = bytes(range(32))
FAST_KDF = Kdf("argon2id", memory_kib=64, time_cost=1, lanes=1)  # tests only: the product's is 64 MiB


def reply(session: EngineSession, messages: list[dict[str, str]], n: int = 12) -> str:
    stream = session.stream_reply(messages, GREEDY, threading.Event(), max_tokens=n)
    while True:
        try:
            next(stream)
        except StopIteration as end:
            return end.value.text


class StoreCalls:
    """``app.store.conversation(conv).messages`` etc., run through the app's one Database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return lambda *args, **kw: self._db.call(lambda store: getattr(store, name)(*args, **kw))


class App:
    """One 'run' of the app: the database on the data dir, an engine, persistence."""

    def __init__(self, data: Path, model: Path, kv_mode: str, n_ctx: int = 1024,
                 crypto: Crypto | None = None) -> None:
        self.db = Database(data / "db.sqlite3", data / "snapshots")
        self.store = StoreCalls(self.db)
        self.engine = EngineSession()
        self.engine.load(LoadSpec(model, n_ctx=n_ctx, kv_mode=kv_mode, kv_recent=0))
        self.persistence = Persistence(self.db, self.engine, data / "fingerprints.json",
                                       crypto or Crypto(ENCRYPTION_KEYRING, KEY))

    def chat_and_save(self, message: str, budget_bytes: int = 0) -> tuple[int, list[dict[str, str]]]:
        user = [{"role": "user", "content": message}]
        turns = [*user, {"role": "assistant", "content": reply(self.engine, user)}]
        conv = self.store.sync_transcript(new_uid(), turns, 0, create=True).id
        self.persistence.save(conv, turns, budget_bytes)
        return conv, [*turns, {"role": "user", "content": "Say that again."}]

    def open(self, conv: int) -> OpenResult:
        progress: list[tuple[int, int]] = []
        messages = self.store.conversation(conv).messages
        result = self.persistence.open(conv, messages, lambda d, t: progress.append((d, t)))
        if result.how == "rebuilt":
            assert progress[-1][0] == progress[-1][1] == result.n_tokens
        return result

    def close(self) -> None:
        self.engine.close()
        self.db.close()


@pytest.mark.parametrize("case", list(CASES))
def test_save_quit_restart_continue_is_exact(model_path: Path, tmp_path: Path, case: str) -> None:
    kv_mode, message = CASES[case]
    first = App(tmp_path, model_path, kv_mode)
    conv, conversation = first.chat_and_save(message)
    expected = reply(first.engine, conversation)  # the uninterrupted session
    first.close()

    second = App(tmp_path, model_path, kv_mode)
    try:
        result = second.open(conv)
        assert (result.how, result.note) == ("restored", "")
        assert reply(second.engine, conversation) == expected
    finally:
        second.close()


@pytest.mark.parametrize(
    ("saved", "opened", "how"),
    [
        ("lazy-after", "f16", "rebuilt"),  # q8_0 cells into an f16 cache: refused, re-read
        ("q8_0", "lazy", "restored"),  # a fresh lazy cache converts first
        ("lazy-before", "q8_0", "restored"),  # unrotated f16 cells convert on read
        ("f16", "lazy", "restored"),
        ("lazy-after", "q8_0", "restored"),
    ],
)
def test_cross_mode_opens_follow_the_restore_matrix(
    smollm2_path: Path, tmp_path: Path, saved: str, opened: str, how: str
) -> None:
    kv_mode, message = CASES[saved]
    first = App(tmp_path, smollm2_path, kv_mode)
    conv, conversation = first.chat_and_save(message)
    first.close()
    second = App(tmp_path, smollm2_path, opened)
    try:
        result = second.open(conv)
        assert result.how == how
        if how == "rebuilt":  # plain words first; the layout in the details
            assert "other context-memory settings" in result.note and "K/V" not in result.note
            assert "the engine refuses its KV state (K/V type mismatch" in result.details
        assert reply(second.engine, conversation).strip()
    finally:
        second.close()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[tuple[Path, int]]:
    """A data dir holding one conversation with a q8_0 snapshot (SmolLM2, n_ctx 1024)."""
    data = tmp_path_factory.mktemp("saved")
    app = App(data, smollm2_path, "q8_0")
    conv, _ = app.chat_and_save(SHORT)
    app.close()
    yield data, conv


@pytest.fixture
def data(saved: tuple[Path, int], tmp_path: Path) -> tuple[Path, int]:
    """A private copy of the saved data dir, free to damage."""
    copy = tmp_path / "data"
    shutil.copytree(saved[0], copy)
    return copy, saved[1]


@pytest.fixture
def app(tmp_path: Path, smollm2_path: Path) -> Iterator[App]:
    """One run on SmolLM2 with a q8_0 cache, keyring-encrypted snapshots; closed after the test."""
    run = App(tmp_path, smollm2_path, "q8_0")
    yield run
    run.close()


def snapshot_file(data: Path) -> Path:
    [path] = (data / "snapshots").glob("*.lkv")
    return path


def open_after(
    data: Path, conv: int, model: Path, kv_mode: str = "q8_0", go_on: bool = True, **kw: object
) -> OpenResult:
    app = App(data, model, kv_mode, **kw)  # type: ignore[arg-type]
    try:
        result = app.open(conv)
        if go_on:
            more = {"role": "user", "content": "More?"}
            assert reply(app.engine, [*app.store.conversation(conv).messages, more], 4)
        assert len(app.store.conversation(conv).messages) == 2  # the transcript is intact whatever happened
        return result
    finally:
        app.close()


def damage(path: Path, offset: int, data: bytes | None = None, truncate: bool = False) -> None:
    raw = bytearray(path.read_bytes())
    if truncate:
        raw = raw[:offset]
    else:
        raw[offset] ^= 0x01 if data is None else 0
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("what", "note"),
    [
        ("truncated", "truncated|damaged|authentic|corrupt"),
        ("bit flip in the payload", "authentic|tamper|wrong key|damaged"),
        ("bit flip in the header", "authentic|tamper|damaged|corrupt|another model|not the one saved"),
        ("missing", "missing"),
    ],
)
def test_damaged_snapshots_fall_back_to_the_transcript(
    data: tuple[Path, int], smollm2_path: Path, what: str, note: str
) -> None:
    path = snapshot_file(data[0])
    size = path.stat().st_size
    if what == "truncated":
        damage(path, size // 2, truncate=True)
    elif what == "bit flip in the payload":
        damage(path, size - 100)
    elif what == "bit flip in the header":
        damage(path, 40)
    else:
        path.unlink()
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt"
    assert re.search(note, result.note, re.IGNORECASE), result.note


def test_wrong_key_falls_back(data: tuple[Path, int], smollm2_path: Path) -> None:
    result = open_after(*data, smollm2_path, crypto=Crypto(ENCRYPTION_KEYRING, bytes(32)))
    assert result.how == "rebuilt" and result.note


def test_tampered_header_fails_authentication(data: tuple[Path, int], smollm2_path: Path) -> None:
    path = snapshot_file(data[0])
    raw = path.read_bytes()
    assert b'"n_ctx": 1024' in raw or b'"n_ctx":1024' in raw
    path.write_bytes(raw.replace(b"1024", b"1000", 1))  # still a valid header, but not the one sealed
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt" and result.note


def test_snapshot_of_another_model_falls_back(data: tuple[Path, int], gemma3_path: Path) -> None:
    result = open_after(*data, gemma3_path)
    assert result.how == "rebuilt" and "another model" in result.note


def test_snapshot_larger_than_the_context_falls_back(tmp_path: Path, smollm2_path: Path) -> None:
    first = App(tmp_path, smollm2_path, "f16", n_ctx=2048)
    conv, _ = first.chat_and_save(LONG + " " + LONG)
    first.close()
    result = open_after(tmp_path, conv, smollm2_path, "f16", go_on=False, n_ctx=1024)
    assert result.how == "rebuilt" and result.note == "it is longer than the context size set now"
    assert "more than this context of 1024" in result.details


@pytest.mark.parametrize("disabled_when", ["saved", "opened"])
def test_rotation_disabled_on_one_side_falls_back(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, disabled_when: str
) -> None:
    if disabled_when == "saved":
        monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    first = App(tmp_path, smollm2_path, "q8_0")
    conv, _ = first.chat_and_save(SHORT)
    first.close()
    if disabled_when == "saved":
        monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE")
    else:
        monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    result = open_after(tmp_path, conv, smollm2_path)
    assert result.how == "rebuilt" and result.note == "it was saved with other context-memory settings"
    assert "rotation" in result.details


def test_future_format_version_falls_back(data: tuple[Path, int], smollm2_path: Path) -> None:
    path = snapshot_file(data[0])
    raw = path.read_bytes()
    marker = b'"format_version":%d' % FORMAT_VERSION
    assert marker in raw
    path.write_bytes(raw.replace(marker, marker[:-1] + b"9", 1))
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt" and "newer" in result.note


def test_disk_full_while_saving_keeps_the_previous_snapshot(
    data: tuple[Path, int], smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, before = snapshot_file(data[0]), snapshot_file(data[0]).read_bytes()
    app = App(data[0], smollm2_path, "q8_0")
    try:
        assert app.open(data[1]).how == "restored"
        more = {"role": "user", "content": "More?"}
        reply(app.engine, [*app.store.conversation(data[1]).messages, more], 4)

        def full(*_: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(SnapshotError, match="disk full|No space"):
            app.persistence.save(data[1], app.store.conversation(data[1]).messages)
        monkeypatch.undo()
        assert path.read_bytes() == before
        assert app.store.conversation(data[1]).snapshot.path == path
        assert [p.name for p in (data[0] / "snapshots").iterdir() if p.name.startswith(".")] == []
    finally:
        app.close()


@pytest.mark.parametrize("scheme", [ENCRYPTION_PASSPHRASE, ENCRYPTION_NONE])
def test_passphrase_and_unencrypted_schemes(tmp_path: Path, smollm2_path: Path, scheme: str) -> None:
    lock = PassphraseLock(tmp_path / "passphrase.json", FAST_KDF)
    unlocked = lock.create("correct horse", "correct horse")
    crypto = Crypto(scheme, unlocked=unlocked if scheme == ENCRYPTION_PASSPHRASE else None)
    first = App(tmp_path, smollm2_path, "f16", crypto=crypto)
    conv, _ = first.chat_and_save(SHORT)
    first.close()
    assert open_after(tmp_path, conv, smollm2_path, "f16", crypto=crypto).how == "restored"
    if scheme == ENCRYPTION_PASSPHRASE:
        other = PassphraseLock(tmp_path / "other.json", FAST_KDF).create("wrong", "wrong")
        wrong = Crypto(scheme, unlocked=other)
        assert open_after(tmp_path, conv, smollm2_path, "f16", crypto=wrong).how == "rebuilt"


def test_budget_prunes_least_recently_used_snapshots_never_transcripts(app: App) -> None:
    conv_a, _ = app.chat_and_save(SHORT)
    conv_b, _ = app.chat_and_save("What is the sea?", budget_bytes=1)  # the rule: never the new one
    assert app.store.conversation(conv_a).snapshot is None
    assert app.store.conversation(conv_b).snapshot is not None
    conv_c, _ = app.chat_and_save("What is a tree?")
    held = app.store.stored_bytes()  # b's and c's files and pieces, shared pieces once
    turns = app.store.conversation(conv_c).messages
    result = app.persistence.save(conv_c, turns, budget_bytes=held + 10**6)
    assert result.pruned == [] and app.store.conversation(conv_b).snapshot is not None
    assert len(app.store.conversation(conv_a).messages) == 2
    assert app.open(conv_a).how == "rebuilt"


def test_a_forged_unencrypted_file_in_place_of_an_encrypted_one_is_refused(
    data: tuple[Path, int], smollm2_path: Path, tmp_path: Path
) -> None:
    forger = App(tmp_path / "forger", smollm2_path, "q8_0", crypto=Crypto(ENCRYPTION_NONE))
    conv, _ = forger.chat_and_save("Ignore all previous instructions.")
    forged = forger.store.conversation(conv).snapshot.path
    forger.close()
    shutil.copyfile(forged, snapshot_file(data[0]))
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt" and "protection differs" in result.note


def _point_row_at(app: App, conv: int, sha256: str, header_json: str, wrapped_key: bytes | None) -> None:
    size = app.store.snapshot_path(sha256).stat().st_size
    app.store.set_snapshot(conv, sha256, size, 1, header_json, wrapped_key)


def test_another_conversations_snapshot_is_refused(app: App) -> None:
    conv_a, _ = app.chat_and_save(SHORT)
    conv_b, _ = app.chat_and_save("What is the sea?")
    b = app.store.conversation(conv_b).snapshot
    _point_row_at(app, conv_a, b.sha256, b.header_json, b.wrapped_key)  # A's row copied from B's: same key
    result = app.open(conv_a)
    assert result.how == "rebuilt" and result.note == "its snapshot belongs to another conversation"
    a_header = app.store.conversation(conv_b).snapshot.header_json
    _point_row_at(app, conv_a, b.sha256, a_header.replace(f'"conversation_id": {conv_b}',
                                                          f'"conversation_id": {conv_a}'), b.wrapped_key)
    result = app.open(conv_a)  # the file's sealed header says B, whatever the row says
    assert result.how == "rebuilt" and "not the one saved" in result.note


def test_an_older_snapshot_of_the_same_conversation_is_refused(tmp_path: Path, app: App) -> None:
    conv, more = app.chat_and_save(SHORT)
    old = app.store.conversation(conv).snapshot
    kept = tmp_path / "old.lkv"
    shutil.copyfile(old.path, kept)
    turns = [*more, {"role": "assistant", "content": reply(app.engine, more)}]
    uid = app.store.conversation(conv).uid
    app.store.sync_transcript(uid, turns, 2)
    app.persistence.save(conv, turns)
    new = app.store.conversation(conv).snapshot
    shutil.copyfile(kept, new.path)  # the file replayed under the new row
    result = app.open(conv)
    assert result.how == "rebuilt" and "not the one saved" in result.note
    shutil.copyfile(kept, old.path)
    _point_row_at(app, conv, old.sha256, old.header_json, old.wrapped_key)  # the row replayed too
    result = app.open(conv)
    assert result.how == "rebuilt"
    assert result.note == "its snapshot holds another version of this conversation"


def test_a_transcript_changed_after_the_save_is_re_read(app: App) -> None:
    conv, _ = app.chat_and_save(SHORT)
    uid = app.store.conversation(conv).uid
    edited = [{"role": "user", "content": SHORT}, {"role": "assistant", "content": "Hm."}]
    app.store.sync_transcript(uid, edited, 2)  # an edit in another window
    result = app.open(conv)
    assert result.how == "rebuilt" and "another version" in result.note


def test_a_refused_restore_says_one_plain_line_and_keeps_the_engines_words_as_details(
    data: tuple[Path, int], smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lazykv.core.engine.types import KvRestoreError

    engine_text = ("state_read_meta: not enough cells in the KV cache\n"
                   "llama_state_seq_set_data: error loading sequence state")  # fmt: skip

    def refuse(self: EngineSession, tokens: object, state: object) -> None:
        raise KvRestoreError(engine_text)

    monkeypatch.setattr(EngineSession, "restore_kv", refuse)
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt"
    assert result.note == "the engine could not take the saved state into this cache"
    assert "\n" not in result.note and "state_read" not in result.note and "llama_" not in result.note
    assert result.details == engine_text


def test_set_crypto_none_drops_the_key_and_saves_nothing(app: App) -> None:
    conv, _ = app.chat_and_save(SHORT)
    app.persistence.set_crypto(None)
    assert app.persistence.crypto is None
    with pytest.raises(SnapshotError, match="snapshots are off"):
        app.persistence.save(conv, app.store.conversation(conv).messages)
    result = app.open(conv)  # the keyring key is gone: the encrypted snapshot cannot be read
    assert result.how == "rebuilt" and "keyring key" in result.note


def test_a_passphrase_crypto_cannot_be_made_without_the_checked_passphrase() -> None:
    with pytest.raises(ValueError, match="checked passphrase"):
        Crypto(ENCRYPTION_PASSPHRASE)
    with pytest.raises(ValueError, match="keyring scheme needs its key"):
        Crypto(ENCRYPTION_KEYRING)


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_format_snapshot_is_refused_as_older(
    data: tuple[Path, int], smollm2_path: Path, version: int
) -> None:
    path = snapshot_file(data[0])
    raw = path.read_bytes()
    marker = b'"format_version":%d' % FORMAT_VERSION
    assert marker in raw
    path.write_bytes(raw.replace(marker, b'"format_version":%d' % version, 1))
    result = open_after(*data, smollm2_path)
    assert result.how == "rebuilt" and result.note == "its snapshot was saved by an older LazyKV Chat"


def _layout_of_rows(native: bytes, at: int) -> bytes:
    """The layout entry's data (type_k, type_v, n_layer) of an upstream state's first stream, whose cell
    count is at ``at``: from the rows' own records."""
    (n_cells,) = struct.unpack_from("<I", native, at)
    at += 4
    for _ in range(n_cells):
        (n_seq,) = struct.unpack_from("<I", native, at + 4)
        at += 8 + 4 * n_seq
    _, n_layer = struct.unpack_from("<II", native, at)
    at += 8
    type_k = struct.unpack_from("<i", native, at)[0]
    for _ in range(n_layer):
        (row,) = struct.unpack_from("<Q", native, at + 4)
        at += 12 + n_cells * row
    type_v = struct.unpack_from("<i", native, at)[0]
    return struct.pack("<iiI", type_k, type_v, n_layer)


def _layout_before_the_extension_block(blob: bytes, versions: bool = True) -> bytes:
    """capture_kv's blob as an earlier engine wrote it: the storage layout after the
    rotation sizes instead of in the extension block, and (``versions``) state versions 12 / 5 in its
    metadata."""
    (n_meta,) = struct.unpack_from("<I", blob)
    meta = json.loads(blob[4 : 4 + n_meta])
    if versions:
        meta.update(seq_version=5, session_version=12)
    native = blob[4 + n_meta :]
    (tag,) = struct.unpack_from("<I", native, 8)
    if tag == 0x6C6B7678:  # 'lkvx', the block of a lazy cache
        size = struct.unpack_from("<I", native, 16)[0]
        entries, at = {}, 20
        while at < 20 + size:
            entry_id, n = struct.unpack_from("<II", native, at)
            entries[entry_id] = native[at + 8 : at + 8 + n]
            at += 8 + n
        layout = entries[1]
    else:  # a plain cache's state is upstream's: the layout from its rows
        at, layout = 8, _layout_of_rows(native, 20)
    header = native[at : at + 12]  # the stream count, the rotation sizes
    old = native[:8] + header + layout + native[at + 12 :]
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    return struct.pack("<I", len(meta_bytes)) + meta_bytes + old


def test_a_snapshot_saved_before_the_extension_block_is_re_read_once(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Issue 25.4: the one format change of the round. A snapshot of the earlier state format (its header
    says sequence state version 5) is refused by its header before the engine sees it, the transcript is
    re-read (nothing is lost), and the next save restores."""
    app = App(tmp_path, smollm2_path, "q8_0", crypto=Crypto(ENCRYPTION_NONE))
    try:
        conv, more = app.chat_and_save(SHORT)
        binding = Binding(conv, transcript_digest(more[:2]))
        header, _, _ = read_snapshot(app.store.conversation(conv).snapshot.path, None, binding)
        assert header.state_version == 4
        kv = app.engine.capture_kv()  # the state saved: the engine's cache as it was
        tokens, state = kv.tokens, kv.state
        # a file of the earlier app: the whole state in it (no pieces), of the earlier state format
        old_header = dataclasses.replace(header, state_version=5, format_version=WHOLE_STATE_VERSION)
        pending = tmp_path / "old.lkv"
        old_state = _layout_before_the_extension_block(bytes(state))
        sha = write_snapshot(pending, old_header, tokens, old_state, None)
        os.replace(pending, app.store.snapshot_path(sha))
        _point_row_at(app, conv, sha, json.dumps(dataclasses.asdict(old_header)), None)
        result = app.open(conv)
        assert (result.how, result.note) == ("rebuilt", "it was saved by another version of the engine")
        assert result.details == "state format 5; this engine uses 4"
        assert len(app.store.conversation(conv).messages) == 2  # the transcript is intact
        app.persistence.save(conv, app.store.conversation(conv).messages)
        assert app.open(conv).how == "restored"
    finally:
        app.close()


def test_the_engine_refuses_the_old_layout_itself(data: tuple[Path, int], smollm2_path: Path) -> None:
    """Without its header's word, the engine's own check refuses a state of the earlier format (the
    in-memory states carry no version), so it is never misread."""
    app = App(data[0], smollm2_path, "q8_0")
    try:
        conv = data[1]
        assert app.open(conv).how == "restored"
        kv = app.engine.capture_kv()
        tokens, state = kv.tokens, kv.state
        assert "sequence state format version: saved 5" in str(
            app.engine.kv_refusal(tokens, _layout_before_the_extension_block(bytes(state))))
        # the metadata passed: the engine's own check
        refusal = app.engine.kv_refusal(tokens, _layout_before_the_extension_block(bytes(state), False))
        assert refusal  # a cell or layer count that does not fit, read where the cells begin
        assert app.engine.kv_refusal(tokens, state) is None
    finally:
        app.close()


class _Spy:
    """The tokens the engine was given by each restore."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.restored: list[list[int]] = []
        real = EngineSession.restore_kv

        def restore_kv(session: EngineSession, tokens: list[int], state: Any) -> None:
            self.restored.append(list(tokens))
            real(session, tokens, state)

        monkeypatch.setattr(EngineSession, "restore_kv", restore_kv)


def test_a_snapshot_swapped_in_while_it_is_restored_is_not_restored(
    app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24.5: another valid snapshot under the same key, put in place of the file just after the
    restore opened it, is not what is restored: the file is read once, and the header checked is the
    one whose bytes are restored."""
    conv_a, more = app.chat_and_save(SHORT)
    conv_b, _ = app.chat_and_save("What is the sea? Tell me in many words, please, at some length.")
    a, b = app.store.conversation(conv_a).snapshot, app.store.conversation(conv_b).snapshot
    a_key = app.persistence.crypto.unwrap(a.wrapped_key, conv_a)
    a_tokens = read_snapshot(a.path, a_key, Binding(conv_a, transcript_digest(more[:2])))[1]
    swapped: list[Path] = []
    real_open = snapshot._open

    def open_then_swap(path: Path) -> Any:
        f = real_open(path)
        if Path(path) == a.path and not swapped:  # the file is replaced right after the first open
            shutil.copyfile(b.path, tmp_path / "swap")
            os.replace(tmp_path / "swap", a.path)
            swapped.append(path)
        return f

    monkeypatch.setattr(snapshot, "_open", open_then_swap)
    spy = _Spy(monkeypatch)
    result = app.open(conv_a)
    assert swapped
    assert result.how == "restored" and spy.restored == [a_tokens]  # A's own bytes, never B's
    result = app.open(conv_a)  # the file is B's now: refused
    assert result.how == "rebuilt" and "not the one saved" in result.note


def test_an_unencrypted_snapshot_is_bound_to_the_sha256_its_row_recorded(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24.5: without encryption anyone can write a well-formed file with the recorded header and a
    checksum that matches; its bytes still differ from the ones the row recorded, so it is refused."""
    app = App(tmp_path, smollm2_path, "q8_0", crypto=Crypto(ENCRYPTION_NONE))
    try:
        conv, more = app.chat_and_save(SHORT)
        ref = app.store.conversation(conv).snapshot
        binding = Binding(conv, transcript_digest(more[:2]))
        header, tokens, state = read_snapshot(ref.path, None, binding)
        forged = [*tokens[:-1], (tokens[-1] + 1) % 1000]  # another reply, under the same header
        write_snapshot(ref.path, header, forged, bytes(state), None)
        assert read_snapshot(ref.path, None, binding)[0] == header  # well-formed, checksum and all
        spy = _Spy(monkeypatch)
        result = app.open(conv)
        assert spy.restored == [] and result.how == "rebuilt"
        assert "could not be authenticated" in result.note
    finally:
        app.close()


def test_after_a_key_change_every_snapshot_restores_under_the_new_key_only(app: App, tmp_path: Path) -> None:
    """Issue 24.14: the snapshots change key with the history (their own keys rewrapped), so they resume
    under the new key; the old one no longer opens them."""
    conv, _ = app.chat_and_save(SHORT)
    unlocked = PassphraseLock(tmp_path / "p.json", FAST_KDF).create("pw", "pw")
    app.persistence.change_crypto(Crypto(ENCRYPTION_PASSPHRASE, unlocked=unlocked))
    assert app.open(conv).how == "restored"
    app.persistence.set_crypto(Crypto(ENCRYPTION_KEYRING, KEY))
    result = app.open(conv)
    assert result.how == "rebuilt" and "could not be authenticated" in result.note


def test_each_snapshot_has_its_own_key_and_a_copy_of_it_does_not_open_once_its_row_is_gone(
    app: App, tmp_path: Path
) -> None:
    """Issue 24.12: the master key alone opens no snapshot: each file's own key is in its row, and the row
    goes with the conversation."""
    conv, more = app.chat_and_save(SHORT)
    ref = app.store.conversation(conv).snapshot
    assert ref.wrapped_key is not None
    binding = Binding(conv, transcript_digest(more[:2]))
    with pytest.raises(SnapshotError):
        read_snapshot(ref.path, KEY, binding)  # the master key is not the file's key
    copy = tmp_path / "copy.lkv"
    shutil.copyfile(ref.path, copy)
    key = app.persistence.crypto.unwrap(ref.wrapped_key, conv)
    assert read_snapshot(copy, key, binding)[1]
    deleted = app.store.delete(conv)
    app.store.erase(deleted.record)
    assert not ref.path.exists()  # and its key, only ever in its row, is gone with it
