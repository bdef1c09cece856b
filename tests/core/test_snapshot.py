"""Snapshot files: round trips, authentication, damage, versions, atomic saves, fuzzing."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazykv.core.history.snapshot import (
    ENCRYPTION_KEYRING,
    ENCRYPTION_NONE,
    ENCRYPTION_PASSPHRASE,
    FORMAT_VERSION,
    MAGIC,
    Binding,
    SnapshotAuthError,
    SnapshotBindingError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotHeader,
    SnapshotOldFormatError,
    SnapshotVersionError,
    read_header,
    read_snapshot,
    transcript_digest,
    write_snapshot,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
BINDING = Binding(7, "cd" * 32)  # make_header's conversation and transcript
TOKENS = [1, 15043, 3186, 29991, 0, 2**31 - 1, 7, 7, 7]
STATE = bytes(range(256)) * 40 + os.urandom(3000)  # compressible part and random part
SCHEMES = [ENCRYPTION_KEYRING, ENCRYPTION_PASSPHRASE, ENCRYPTION_NONE]
DAMAGED = (SnapshotAuthError, SnapshotCorruptError)
REFUSED = (*DAMAGED, SnapshotVersionError, SnapshotOldFormatError, SnapshotBindingError)


def make_header(encryption: str = ENCRYPTION_KEYRING, n_tokens: int = len(TOKENS)) -> SnapshotHeader:
    return SnapshotHeader(
        app_version="0.1.0",
        engine_version="0.3.36+lazykv.2b6b96c19b",
        model_sha256="ab" * 32,
        n_ctx=4096,
        type_k="q8_0",
        type_v="q8_0",
        kv_mode="lazy",
        lazy_phase="q8_0",
        n_rot_k=64,
        n_rot_v=64,
        state_version=3,
        n_tokens=n_tokens,
        encryption=encryption,
        conversation_id=7,
        n_messages=2,
        transcript_sha256="cd" * 32,
        created=1_700_000_000.5,
    )


def key_for(encryption: str) -> bytes | None:
    return None if encryption == ENCRYPTION_NONE else KEY


def write(path: Path, encryption: str = ENCRYPTION_KEYRING) -> str:
    return write_snapshot(path, make_header(encryption), TOKENS, STATE, key_for(encryption))


def split_file(data: bytes) -> tuple[int, bytes, bytes]:
    """(header length, header bytes, body) of a snapshot file."""
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    return length, data[start : start + length], data[start + length :]


def with_header(data: bytes, header_bytes: bytes) -> bytes:
    _, _, body = split_file(data)
    return MAGIC + struct.pack("<I", len(header_bytes)) + header_bytes + body


@pytest.mark.parametrize("encryption", SCHEMES)
def test_round_trip(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    digest = write(path, encryption)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    header, tokens, state = read_snapshot(path, key_for(encryption), BINDING)
    assert header == make_header(encryption)
    assert tokens == TOKENS
    assert state == STATE
    assert read_header(path) == header


@pytest.mark.parametrize("encryption", SCHEMES)
def test_round_trip_empty(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "empty.lkv"
    write_snapshot(path, make_header(encryption, n_tokens=0), [], b"", key_for(encryption))
    assert read_snapshot(path, key_for(encryption), BINDING)[1:] == ([], b"")


def test_layout_is_as_documented(tmp_path: Path) -> None:
    path = tmp_path / "plain.lkv"
    write(path, ENCRYPTION_NONE)
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    length, header_bytes, body = split_file(data)
    assert header_bytes == make_header(ENCRYPTION_NONE).to_bytes()
    assert json.loads(header_bytes)["format_version"] == FORMAT_VERSION
    compressed, checksum = body[:-32], body[-32:]
    assert checksum == hashlib.sha256(data[:-32]).digest()
    payload = zlib.decompress(compressed)
    assert payload == struct.pack(f"<I{len(TOKENS)}i", len(TOKENS), *TOKENS) + STATE


def test_encrypted_body_hides_the_state(tmp_path: Path) -> None:
    path = tmp_path / "chat.lkv"
    write(path)
    _, _, body = split_file(path.read_bytes())
    with pytest.raises(zlib.error):
        zlib.decompress(body[12:-16])
    assert len(body) >= 12 + 16


def test_header_is_canonical_json() -> None:
    header = make_header()
    data = header.to_bytes()
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    assert SnapshotHeader.from_bytes(data) == header


def test_each_write_uses_a_fresh_nonce(tmp_path: Path) -> None:
    first, second = tmp_path / "a.lkv", tmp_path / "b.lkv"
    assert write(first) != write(second)
    assert split_file(first.read_bytes())[2][:12] != split_file(second.read_bytes())[2][:12]


@pytest.mark.parametrize("encryption", [ENCRYPTION_KEYRING, ENCRYPTION_PASSPHRASE])
def test_wrong_key(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    write(path, encryption)
    with pytest.raises(SnapshotAuthError, match="wrong key"):
        read_snapshot(path, OTHER_KEY, BINDING)


def test_encrypted_file_needs_a_key(tmp_path: Path) -> None:
    path = tmp_path / "chat.lkv"
    write(path)
    with pytest.raises(SnapshotAuthError):
        read_snapshot(path, None, BINDING)


def test_plain_file_refused_when_a_key_is_expected(tmp_path: Path) -> None:
    """A forged unencrypted file cannot stand in for an encrypted one."""
    path = tmp_path / "chat.lkv"
    write(path, ENCRYPTION_NONE)
    with pytest.raises(SnapshotAuthError):
        read_snapshot(path, KEY, BINDING)


def test_key_must_match_the_scheme(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "a", make_header(ENCRYPTION_NONE), TOKENS, STATE, KEY)
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "b", make_header(ENCRYPTION_KEYRING), TOKENS, STATE, None)
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "c", make_header(ENCRYPTION_KEYRING), TOKENS, STATE, KEY[:16])
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "d", make_header(), TOKENS[:-1], STATE, KEY)
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "e", make_header(n_tokens=1), [2**31], STATE, KEY)
    with pytest.raises(ValueError):
        write_snapshot(tmp_path / "f", dataclasses.replace(make_header(), kv_mode="q4"), TOKENS, STATE, KEY)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("encryption", SCHEMES)
def test_bit_flips_are_refused(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    write(path, encryption)
    good = path.read_bytes()
    # a flip that turns format_version into an older one reads as an older file, a higher as a newer one
    version_digit = good.index(b'"format_version":%d' % FORMAT_VERSION) + len(b'"format_version":')
    header_end = len(MAGIC) + 4 + split_file(good)[0]
    offsets = [
        *range(header_end + 64),
        *range(header_end + 64, len(good) - 64, 11),
        *range(len(good) - 64, len(good)),
    ]
    for offset in offsets:
        bad = bytearray(good)
        bad[offset] ^= 1 << (offset % 8)
        path.write_bytes(bad)
        with pytest.raises(REFUSED) as info:
            read_snapshot(path, key_for(encryption), BINDING)
        versions = (SnapshotVersionError, SnapshotOldFormatError)
        assert offset == version_digit or not isinstance(info.value, versions)


@pytest.mark.parametrize("encryption", SCHEMES)
def test_truncation_is_refused(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    write(path, encryption)
    good = path.read_bytes()
    for size in [*range(0, 400, 3), *range(400, len(good), 97), *range(len(good) - 40, len(good))]:
        path.write_bytes(good[:size])
        with pytest.raises(DAMAGED):
            read_snapshot(path, key_for(encryption), BINDING)
        if size < len(MAGIC) + 4 + split_file(good)[0]:
            with pytest.raises(SnapshotCorruptError):
                read_header(path)


@pytest.mark.parametrize("encryption", SCHEMES)
def test_appended_bytes_are_refused(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    write(path, encryption)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(DAMAGED):
        read_snapshot(path, key_for(encryption), BINDING)


@pytest.mark.parametrize("encryption", [ENCRYPTION_KEYRING, ENCRYPTION_PASSPHRASE])
def test_tampered_header_field_fails_authentication(tmp_path: Path, encryption: str) -> None:
    path = tmp_path / "chat.lkv"
    write(path, encryption)
    data = path.read_bytes()
    _, header_bytes, _ = split_file(data)
    fields = json.loads(header_bytes)
    fields["n_ctx"] = 40960
    tampered = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    assert len(tampered) != len(header_bytes)
    path.write_bytes(with_header(data, tampered))
    assert read_header(path).n_ctx == 40960  # parses: only authentication can catch it
    with pytest.raises(SnapshotAuthError):
        read_snapshot(path, KEY, BINDING)


def test_tampered_header_of_plain_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "chat.lkv"
    write(path, ENCRYPTION_NONE)
    data = path.read_bytes()
    tampered = split_file(data)[1].replace(b'"n_ctx":4096', b'"n_ctx":8192')
    path.write_bytes(with_header(data, tampered))
    with pytest.raises(SnapshotCorruptError, match="checksum"):
        read_snapshot(path, None, BINDING)


@pytest.mark.parametrize("version", [1, 2])
def test_older_format_headers_are_refused_as_older(version: int) -> None:
    fields = json.loads(make_header().to_bytes())
    fields["format_version"] = version
    with pytest.raises(SnapshotOldFormatError, match="older LazyKV Chat"):
        SnapshotHeader.from_bytes(json.dumps(fields).encode())


def test_transcript_digest_covers_roles_and_contents_in_order() -> None:
    a = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert transcript_digest(a) == transcript_digest([dict(m) for m in a])
    assert transcript_digest(a) != transcript_digest(a[::-1])
    assert transcript_digest(a) != transcript_digest([{"role": "assistant", "content": "hi"}, a[1]])
    assert transcript_digest(a[:1]) != transcript_digest(a)


def test_future_format_version(tmp_path: Path) -> None:
    header = dataclasses.replace(make_header(), format_version=FORMAT_VERSION + 1)
    fields = json.loads(header.to_bytes())
    fields["new_field_of_the_future"] = [1, 2]  # checked before the strict field checks
    del fields["n_rot_k"]
    data = json.dumps(fields).encode()
    with pytest.raises(SnapshotVersionError, match="newer LazyKV Chat"):
        SnapshotHeader.from_bytes(data)
    path = tmp_path / "future.lkv"
    path.write_bytes(MAGIC + struct.pack("<I", len(data)) + data + b"body of the future")
    with pytest.raises(SnapshotVersionError):
        read_header(path)
    with pytest.raises(SnapshotVersionError):
        read_snapshot(path, KEY, BINDING)


def test_missing_file(tmp_path: Path) -> None:
    for read in (read_header, lambda p: read_snapshot(p, KEY, BINDING)):
        with pytest.raises(SnapshotError, match="snapshot file missing"):
            read(tmp_path / "nope.lkv")


def test_not_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"just some text, long enough to have a header length")
    with pytest.raises(SnapshotCorruptError, match="not a LazyKV Chat snapshot"):
        read_header(path)


def _header_variants() -> list[tuple[str, object]]:
    return [
        ("n_ctx", 0),
        ("n_ctx", -5),
        ("n_ctx", "4096"),
        ("n_ctx", True),
        ("n_ctx", 4096.0),
        ("n_tokens", -1),
        ("n_tokens", 4097),
        ("n_rot_k", -1),
        ("state_version", None),
        ("type_k", "q4_1"),
        ("type_v", ["f16"]),
        ("kv_mode", "LAZY"),
        ("lazy_phase", "converting"),
        ("encryption", "rot13"),
        ("model_sha256", "AB" * 32),
        ("model_sha256", "ab" * 31),
        ("app_version", ""),
        ("app_version", "1\n2"),
        ("engine_version", 3),
        ("created", -1.0),
        ("created", "yesterday"),
        ("format_version", 0),
        ("format_version", "1"),
        ("conversation_id", 0),
        ("conversation_id", "7"),
        ("n_messages", -1),
        ("transcript_sha256", "CD" * 32),
        ("transcript_sha256", ""),
    ]


@pytest.mark.parametrize(("field", "value"), _header_variants())
def test_strict_header_values(field: str, value: object) -> None:
    fields = json.loads(make_header().to_bytes())
    fields[field] = value
    with pytest.raises(SnapshotCorruptError):
        SnapshotHeader.from_bytes(json.dumps(fields).encode())


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b"null",
        b"\xff\xfe",
        b"[" * 20000 + b"]" * 20000,
        make_header().to_bytes().replace(b'"created":1700000000.5', b'"created":NaN'),
        make_header().to_bytes().replace(b'"created":1700000000.5', b'"created":1e999'),
        make_header().to_bytes().replace(b'"n_ctx":4096', b'"n_ctx":' + b"9" * 5000),
        b'{"a": 1, "a": 2}',
    ],
)
def test_header_that_does_not_parse(data: bytes) -> None:
    with pytest.raises(SnapshotCorruptError):
        SnapshotHeader.from_bytes(data)


def test_strict_header_field_set() -> None:
    fields = json.loads(make_header().to_bytes())
    with pytest.raises(SnapshotCorruptError):
        SnapshotHeader.from_bytes(json.dumps({**fields, "extra": 1}).encode())
    del fields["created"]
    with pytest.raises(SnapshotCorruptError):
        SnapshotHeader.from_bytes(json.dumps(fields).encode())
    fields = json.loads(make_header().to_bytes())
    text = json.dumps(fields)
    duplicated = text[:-1] + ', "n_ctx": 8}'
    with pytest.raises(SnapshotCorruptError):
        SnapshotHeader.from_bytes(duplicated.encode())


def test_header_length_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "huge.lkv"
    path.write_bytes(MAGIC + struct.pack("<I", 2**32 - 1) + b"{}")
    with pytest.raises(SnapshotCorruptError, match="header length"):
        read_header(path)


def _plain_file(path: Path, payload: bytes, n_tokens: int) -> None:
    """An unencrypted file with a valid checksum around an arbitrary compressed payload."""
    header = make_header(ENCRYPTION_NONE, n_tokens=n_tokens).to_bytes()
    prefix = MAGIC + struct.pack("<I", len(header)) + header
    compressed = zlib.compress(payload, 9)
    path.write_bytes(prefix + compressed + hashlib.sha256(prefix + compressed).digest())


def test_decompression_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.lkv"
    _plain_file(path, struct.pack("<I", 0) + bytes(20_000_000), n_tokens=0)
    assert path.stat().st_size < 100_000
    with pytest.raises(SnapshotCorruptError, match="limit"):
        read_snapshot(path, None, BINDING, max_payload_bytes=1_000_000)
    assert len(read_snapshot(path, None, BINDING, max_payload_bytes=20_000_004)[2]) == 20_000_000


def test_token_count_must_match_header(tmp_path: Path) -> None:
    path = tmp_path / "count.lkv"
    _plain_file(path, struct.pack("<I2i", 2, 5, 6), n_tokens=3)
    with pytest.raises(SnapshotCorruptError, match="token count"):
        read_snapshot(path, None, BINDING)
    _plain_file(path, struct.pack("<Ii", 2, 5), n_tokens=2)
    with pytest.raises(SnapshotCorruptError, match="truncated"):
        read_snapshot(path, None, BINDING)


# --- atomic saves ----------------------------------------------------------------------------------


def _disk_full(*args: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fail_after", [0, 1, 3])
def test_disk_full_while_writing_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_after: int
) -> None:
    path = tmp_path / "chat.lkv"
    write(path)
    old = path.read_bytes()
    real_write = os.write
    calls = 0

    def write_until_full(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls > fail_after:
            _disk_full()
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write_until_full)
    with pytest.raises(SnapshotError, match="disk full") as info:
        write_snapshot(path, make_header(n_tokens=1), [9], b"new state", KEY)
    monkeypatch.undo()
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.lkv"]


def test_disk_full_on_fsync_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "chat.lkv"
    write(path, ENCRYPTION_NONE)
    old = path.read_bytes()
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(SnapshotError, match="disk full"):
        write_snapshot(path, make_header(ENCRYPTION_NONE, n_tokens=0), [], b"", None)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["chat.lkv"]


def test_other_os_errors_become_snapshot_errors(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="could not save the snapshot") as info:
        write(tmp_path / "no such dir" / "chat.lkv")
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_saved_file_is_private_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "chat.lkv"
    path.write_bytes(b"old")
    write(path)
    assert read_snapshot(path, KEY, BINDING)[1] == TOKENS
    if os.name == "posix":
        assert path.stat().st_mode & 0o077 == 0
    assert [p.name for p in tmp_path.iterdir()] == ["chat.lkv"]


# --- fuzzing ---------------------------------------------------------------------------------------

_FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def valid_files(fuzz_dir: Path) -> dict[str, bytes]:
    """A valid file per scheme (checked to open, so the fuzz tests are not vacuous)."""
    files = {}
    for scheme in SCHEMES:
        path = fuzz_dir / "valid.lkv"
        write(path, scheme)
        assert read_snapshot(path, key_for(scheme), BINDING)[1] == TOKENS
        files[scheme] = path.read_bytes()
    return files


@st.composite
def mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` changed by flips at distinct offsets, a splice, a truncation or an extension."""
    kind = draw(st.sampled_from(["flip", "splice", "truncate", "extend"]))
    if kind == "flip":
        offsets = draw(st.sets(st.integers(0, len(data) - 1), min_size=1, max_size=8))
        out = bytearray(data)
        for offset in offsets:
            out[offset] ^= draw(st.integers(1, 255))
        return bytes(out)
    if kind == "splice":
        start = draw(st.integers(0, len(data) - 1))
        end = draw(st.integers(start, min(len(data), start + 64)))
        replacement = draw(st.binary(max_size=64).filter(lambda b, s=start, e=end: b != data[s:e]))
        return data[:start] + replacement + data[end:]
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    return data + draw(st.binary(min_size=1, max_size=64))


@_FUZZ
@given(data=st.binary(max_size=2048), prefix=st.sampled_from([b"", MAGIC, MAGIC + struct.pack("<I", 40)]))
def test_fuzz_arbitrary_bytes(fuzz_dir: Path, data: bytes, prefix: bytes) -> None:
    path = fuzz_dir / "fuzz.lkv"
    path.write_bytes(prefix + data)
    for read in (read_header, lambda p: read_snapshot(p, KEY, BINDING),
                 lambda p: read_snapshot(p, None, BINDING)):
        try:
            read(path)
        except SnapshotError:
            pass


@_FUZZ
@given(data=st.data(), scheme=st.sampled_from(SCHEMES))
def test_fuzz_mutated_files_never_open(
    fuzz_dir: Path, valid_files: dict[str, bytes], data: st.DataObject, scheme: str
) -> None:
    mutated = data.draw(mutations(valid_files[scheme]))
    assert mutated != valid_files[scheme]
    path = fuzz_dir / "fuzz.lkv"
    path.write_bytes(mutated)
    try:
        read_header(path)
    except SnapshotError:
        pass
    for key in (KEY, None):
        with pytest.raises(SnapshotError):
            read_snapshot(path, key, BINDING)


@_FUZZ
@given(data=st.data())
def test_fuzz_mutated_header_values(
    fuzz_dir: Path, valid_files: dict[str, bytes], data: st.DataObject
) -> None:
    """One header value changed: the header often still parses, so authentication must catch it."""
    good = valid_files[ENCRYPTION_KEYRING]
    fields = json.loads(split_file(good)[1])
    name = data.draw(st.sampled_from(sorted(fields)))
    value = data.draw(st.one_of(st.integers(-2, 2**33), st.text(max_size=20), st.none(), st.booleans()))
    if fields[name] == value and type(fields[name]) is type(value):
        return
    fields[name] = value
    path = fuzz_dir / "fuzz.lkv"
    path.write_bytes(with_header(good, json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()))
    with pytest.raises(SnapshotError):
        read_snapshot(path, KEY, BINDING)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme=st.sampled_from(SCHEMES), where=st.floats(0, 1, exclude_max=True), xor=st.integers(1, 255),
       flip=st.sampled_from(["file", "conversation", "transcript"]))
def test_snapshot_binding_refuses_any_single_flipped_byte(
    fuzz_dir: Path, valid_files: dict[str, bytes], scheme: str, where: float, xor: int, flip: str
) -> None:
    """One byte of the file, or of the binding the reader expects, changed: never opened. An unencrypted
    file is read as the app reads it, against the sha256 its database row recorded."""
    good = valid_files[scheme]
    recorded = hashlib.sha256(good).hexdigest() if scheme == ENCRYPTION_NONE else None
    data, binding = bytearray(good), BINDING
    if flip == "file":
        data[int(where * len(data))] ^= xor
    elif flip == "conversation":
        binding = Binding(BINDING.conversation_id ^ xor, BINDING.transcript_sha256)
    else:
        digest = bytearray(bytes.fromhex(BINDING.transcript_sha256))
        digest[int(where * len(digest))] ^= xor
        binding = Binding(BINDING.conversation_id, digest.hex())
    path = fuzz_dir / "flipped.lkv"
    path.write_bytes(data)
    with pytest.raises(SnapshotError):
        read_snapshot(path, key_for(scheme), binding, sha256=recorded)
