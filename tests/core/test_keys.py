"""The snapshot key: OS keyring storage (in-memory and fail backends) and the passphrase KDF."""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keyring
import keyring.errors
import pytest
from argon2.low_level import Type, hash_secret_raw
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from keyring.backend import KeyringBackend
from keyring.backends import fail, null

from lazykv.core.history import keys
from lazykv.core.history.keys import (
    KEY_NAME,
    SERVICE,
    Kdf,
    KeyringTimeoutError,
    KeyringUnavailableError,
    PassphraseError,
    PassphraseLock,
    PassphraseMismatchError,
    WrongPassphraseError,
    database_key,
    key_from_passphrase,
    keyring_available,
    load_or_create_key,
    new_salt,
)
from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Database
from tests.support.history import stored_messages

FAST_KDF = Kdf("argon2id", memory_kib=64, time_cost=1, lanes=1)  # tests only: the product's is 64 MiB


class MemoryKeyring(KeyringBackend):
    """A keyring that lives in a dict, counting writes."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[tuple[str, str], str] = {}
        self.writes = 0

    def get_password(self, service: str, username: str) -> str | None:
        return self.secrets.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.writes += 1
        self.secrets[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.secrets.pop((service, username), None)


class LockedKeyring(MemoryKeyring):
    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.KeyringLocked("the collection is locked")


@pytest.fixture
def use_keyring() -> Iterator[Callable[[KeyringBackend], None]]:
    """Install a keyring backend for one test; the previous one comes back afterwards."""
    previous = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(previous)


def test_key_created_once_and_reused(use_keyring: Callable[[KeyringBackend], None]) -> None:
    backend = MemoryKeyring()
    use_keyring(backend)
    assert keyring_available()
    first = load_or_create_key()
    assert isinstance(first, bytes) and len(first) == 32
    assert load_or_create_key() == first
    assert load_or_create_key() == first
    assert backend.writes == 1
    assert base64.b64decode(backend.secrets[(SERVICE, KEY_NAME)]) == first


def test_keys_are_random(use_keyring: Callable[[KeyringBackend], None]) -> None:
    use_keyring(MemoryKeyring())
    first = load_or_create_key()
    use_keyring(MemoryKeyring())
    assert load_or_create_key() != first


def test_existing_key_is_used(use_keyring: Callable[[KeyringBackend], None]) -> None:
    backend = MemoryKeyring()
    stored = bytes(range(32))
    backend.secrets[(SERVICE, KEY_NAME)] = base64.b64encode(stored).decode()
    use_keyring(backend)
    assert load_or_create_key() == stored
    assert backend.writes == 0


@pytest.mark.parametrize("stored", ["not base64!", base64.b64encode(b"short").decode(), ""])
def test_damaged_key_is_reported_and_kept(use_keyring: Callable[[KeyringBackend], None], stored: str) -> None:
    backend = MemoryKeyring()
    backend.secrets[(SERVICE, KEY_NAME)] = stored
    use_keyring(backend)
    with pytest.raises(KeyringUnavailableError, match="damaged") as info:
        load_or_create_key()
    assert "snapshot key" not in str(info.value) and "snapshot key" in info.value.details
    assert backend.secrets[(SERVICE, KEY_NAME)] == stored
    assert backend.writes == 0


@pytest.mark.parametrize("backend", [fail.Keyring(), null.Keyring()], ids=["fail", "null"])
def test_no_keyring(use_keyring: Callable[[KeyringBackend], None], backend: KeyringBackend) -> None:
    use_keyring(backend)
    assert not keyring_available()
    with pytest.raises(KeyringUnavailableError) as info:
        load_or_create_key()
    message = str(info.value)  # plain words first, the technical account on demand
    assert message == "Your system's keyring (where passwords are kept) is not available."
    assert "Secret Service" in info.value.details and "Secret Service" in info.value.__notes__[0]


def test_keyring_errors_become_unavailable(use_keyring: Callable[[KeyringBackend], None]) -> None:
    use_keyring(LockedKeyring())
    with pytest.raises(KeyringUnavailableError, match="locked") as info:
        load_or_create_key()
    assert isinstance(info.value.__cause__, keyring.errors.KeyringLocked)


def test_backend_that_drops_writes(use_keyring: Callable[[KeyringBackend], None]) -> None:
    class Forgetful(MemoryKeyring):
        def set_password(self, service: str, username: str, password: str) -> None:
            self.writes += 1

    use_keyring(Forgetful())
    with pytest.raises(KeyringUnavailableError):
        load_or_create_key()


def test_passphrase_key_is_deterministic() -> None:
    salt = bytes(16)
    key = key_from_passphrase("correct horse", salt, FAST_KDF)
    assert len(key) == 32
    assert key_from_passphrase("correct horse", salt, FAST_KDF) == key
    assert key_from_passphrase("correct horse", b"\x01" + bytes(15), FAST_KDF) != key
    assert key_from_passphrase("correct horsf", salt, FAST_KDF) != key


def test_passphrase_is_unicode_normalized() -> None:
    salt = b"s" * 16
    for kdf in (FAST_KDF, keys.LEGACY_SCRYPT):
        assert key_from_passphrase("caf\u00e9", salt, kdf) == key_from_passphrase("cafe\u0301", salt, kdf)


def test_the_passphrase_kdf_is_argon2id_at_owasp_strength_or_more() -> None:
    """Issue 24.11: Argon2id with at least OWASP's m=19 MiB, t=2, p=1 (scrypt N=2**15 was below)."""
    kdf = keys.ARGON2ID
    assert kdf.name == "argon2id" and kdf.lanes == 1
    assert kdf.memory_kib >= 19 * 1024 and kdf.time_cost >= 2
    assert PassphraseLock(Path("unused")).kdf == kdf  # what the app's lock uses
    salt = b"0123456789abcdef"
    expected = hash_secret_raw(b"pw", salt, time_cost=kdf.time_cost, memory_cost=kdf.memory_kib,
                               parallelism=1, hash_len=32, type=Type.ID)  # fmt: skip
    assert key_from_passphrase("pw", salt) == expected
    scrypt = Scrypt(salt=salt, length=32, n=2**15, r=8, p=1)
    assert keys.LEGACY_SCRYPT.derive("pw", salt) == scrypt.derive(b"pw")


def test_passphrase_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        key_from_passphrase("", bytes(16), FAST_KDF)
    with pytest.raises(ValueError):
        key_from_passphrase("pw", bytes(8), FAST_KDF)


def test_new_salt() -> None:
    first, second = new_salt(), new_salt()
    assert len(first) == 16 and first != second


class HangingKeyring(MemoryKeyring):
    """A keyring whose unlock prompt nobody answers: every call blocks until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def get_password(self, service: str, username: str) -> str | None:
        self.release.wait()
        return super().get_password(service, username)


def test_a_hanging_keyring_times_out_and_holds_nothing_else_up(
    use_keyring: Callable[[KeyringBackend], None], tmp_path: Path
) -> None:
    backend = HangingKeyring()
    use_keyring(backend)
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        started = time.monotonic()
        asking = ThreadPoolExecutor(1).submit(load_or_create_key, 3.0)
        saved = db.call(lambda s: s.sync_transcript(new_uid(), [{"role": "user", "content": "kept"}], 0,
                                                    create=True))  # fmt: skip
        assert not asking.done()  # the transcript was saved while the keyring still hung
        with pytest.raises(KeyringTimeoutError, match="did not answer within 3 s"):
            asking.result(30)
        assert time.monotonic() - started >= 3.0  # given up at the timeout, not before
        assert db.call(lambda s: stored_messages(s, saved.id)) == [{"role": "user", "content": "kept"}]
    finally:
        backend.release.set()
        db.close(10)


def test_a_keyring_that_answers_after_its_timeout_still_gives_the_key(
    use_keyring: Callable[[KeyringBackend], None],
) -> None:
    backend = HangingKeyring()
    use_keyring(backend)
    with pytest.raises(KeyringTimeoutError) as timed_out:
        load_or_create_key(0.1)
    assert not timed_out.value.late.done()
    backend.release.set()  # unlocked at last
    key = timed_out.value.late.result(30)
    assert len(key) == 32 and load_or_create_key(5) == key


def test_a_process_whose_keyring_hangs_exits_at_once(tmp_path: Path) -> None:
    script = (
        "import threading, keyring\n"
        "from keyring.backend import KeyringBackend\n"
        "from lazykv.core.history.keys import KeyringTimeoutError, load_or_create_key\n"
        "class Hang(KeyringBackend):\n"
        "    priority = 1\n"
        "    def get_password(self, s, u): threading.Event().wait()\n"
        "    def set_password(self, s, u, p): pass\n"
        "    def delete_password(self, s, u): pass\n"
        "keyring.set_keyring(Hang())\n"
        "try:\n"
        "    load_or_create_key(0.2)\n"
        "except KeyringTimeoutError:\n"
        "    print('timed out', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "app")}
    # the hung keyring thread never ends: the process exits at all only because it does not wait for it
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == "timed out", done.stderr


def test_keyring_errors_still_arrive_through_the_keyring_thread(
    use_keyring: Callable[[KeyringBackend], None],
) -> None:
    use_keyring(LockedKeyring())
    with pytest.raises(KeyringUnavailableError, match="locked"):
        load_or_create_key()


def test_a_new_passphrase_must_be_typed_twice(tmp_path: Path) -> None:
    lock = PassphraseLock(tmp_path / "sub" / "passphrase.json", FAST_KDF)
    assert not lock.is_set()
    with pytest.raises(PassphraseMismatchError, match="differ"):
        lock.create("correct horse", "correct hrose")
    assert not lock.is_set()
    unlocked = lock.create("correct horse", "correct horse")
    assert lock.is_set() and len(unlocked.key) == 32
    assert stat.S_IMODE(lock.path.stat().st_mode) == 0o600
    assert b"horse" not in lock.path.read_bytes() and unlocked.key.hex() not in lock.path.read_text()
    record = json.loads(lock.path.read_text())
    assert record["version"] == 2 and record["kdf"] == FAST_KDF.to_json()  # the parameters are stored


def test_a_typo_is_refused_and_the_right_passphrase_can_be_retried(tmp_path: Path) -> None:
    lock = PassphraseLock(tmp_path / "passphrase.json", FAST_KDF)
    chosen = lock.create("correct horse", "correct horse")
    for typo in ("correct hrose", "Correct horse", ""):
        with pytest.raises(WrongPassphraseError):
            lock.unlock(typo)
    again = lock.unlock("correct horse")
    assert again == chosen and not again.upgraded


def test_an_existing_salt_keeps_the_key_older_data_was_saved_with(tmp_path: Path) -> None:
    salt = bytes(range(16))
    unlocked = PassphraseLock(tmp_path / "p.json", FAST_KDF).create("pw", "pw", salt)
    assert unlocked.key == Scrypt(salt=salt, length=32, n=2**15, r=8, p=1).derive(b"pw")
    assert PassphraseLock(tmp_path / "p.json", FAST_KDF).unlock("pw").key == unlocked.key


def _old_record(path: Path, passphrase: str) -> bytes:
    """A passphrase record as the releases before Argon2id wrote it (keys.py at 245602d): scrypt
    N=2**15 of the passphrase is the key itself, an HMAC of it the verifier. Returns that key."""
    salt = os.urandom(16)
    key = Scrypt(salt=salt, length=32, n=2**15, r=8, p=1).derive(passphrase.encode())
    verifier = hmac.new(key, b"lazykv passphrase verifier v1", hashlib.sha256).digest()
    path.write_text(json.dumps({"version": 1, "salt": salt.hex(), "verifier": verifier.hex()}))
    return key


def test_an_old_scrypt_record_still_opens_and_is_upgraded_to_argon2id_at_its_next_unlock(
    tmp_path: Path,
) -> None:
    """Issue 24.11: what an older release saved (a scrypt record and a history encrypted with its key)
    opens; the record is rewritten with Argon2id at that unlock, the data keeps its key."""
    path = tmp_path / "passphrase.json"
    old_key = _old_record(path, "correct horse")
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps", key=database_key(old_key))
    conv = db.call(lambda s: s.sync_transcript(new_uid(), [{"role": "user", "content": "saved"}], 0,
                                               create=True)).id  # fmt: skip
    db.close(10)
    lock = PassphraseLock(path, FAST_KDF)
    with pytest.raises(WrongPassphraseError):
        lock.unlock("correct hrose")
    assert json.loads(path.read_text())["version"] == 1  # a wrong passphrase changes nothing
    unlocked = lock.unlock("correct horse")
    assert unlocked.key == old_key and unlocked.upgraded
    record = json.loads(path.read_text())
    assert record["version"] == 2 and record["kdf"]["name"] == "argon2id" and "verifier" not in record
    again = PassphraseLock(path, FAST_KDF).unlock("correct horse")
    assert again.key == old_key and not again.upgraded
    with pytest.raises(WrongPassphraseError):
        lock.unlock("correct hrose")
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps", key=database_key(again.key))
    assert db.call(lambda s: s.conversation(conv).messages) == [{"role": "user", "content": "saved"}]
    db.close(10)


def test_a_record_with_weaker_parameters_is_upgraded_and_a_failed_upgrade_still_unlocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "passphrase.json"
    made = PassphraseLock(path, FAST_KDF).create("pw", "pw")
    stronger = Kdf("argon2id", memory_kib=128, time_cost=2, lanes=1)

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keys, "write_text_atomic", full)
    failed = PassphraseLock(path, stronger).unlock("pw")
    assert failed.key == made.key and not failed.upgraded  # tried again at the next unlock
    monkeypatch.undo()
    upgraded = PassphraseLock(path, stronger).unlock("pw")
    assert upgraded.key == made.key and upgraded.upgraded
    assert json.loads(path.read_text())["kdf"] == stronger.to_json()


@pytest.mark.parametrize("kdf", [
    {"name": "argon2id", "m": 2**40, "t": 3, "p": 1},
    {"name": "argon2id", "m": 65536, "t": 0, "p": 1},
    {"name": "scrypt", "n": 3, "r": 8, "p": 1},
    {"name": "bcrypt", "m": 1, "t": 1, "p": 1},
    {"name": "argon2id", "m": "64", "t": 3, "p": 1},
])
def test_stored_kdf_parameters_out_of_bounds_are_refused(tmp_path: Path, kdf: dict) -> None:
    path = tmp_path / "passphrase.json"
    PassphraseLock(path, FAST_KDF).create("pw", "pw")
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "kdf": kdf}))
    with pytest.raises(PassphraseError, match="move it away"):
        PassphraseLock(path, FAST_KDF).unlock("pw")


def test_a_damaged_passphrase_file_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "passphrase.json"
    path.write_text("{not json")
    with pytest.raises(PassphraseError, match="move it away"):
        PassphraseLock(path).unlock("pw")


# made by PassphraseLock.create("correct horse battery", ...) of keys.py at 245602d (scrypt N=2**15)
OLD_RECORD = Path(__file__).parent / "data" / "passphrase-v1.json"
OLD_RECORD_KEY = "42a2d3bfb3ab25e9168d747a418cadbf3ecefa27ba31518e5470615ba4f5e247"


def test_a_record_written_by_the_scrypt_release_opens_with_its_key_and_is_upgraded(tmp_path: Path) -> None:
    """Issue 24.11, on a fixture the old code path wrote: same key, now behind Argon2id."""
    path = tmp_path / "passphrase.json"
    path.write_bytes(OLD_RECORD.read_bytes())
    with pytest.raises(WrongPassphraseError):
        PassphraseLock(path, FAST_KDF).unlock("correct horse")
    unlocked = PassphraseLock(path, FAST_KDF).unlock("correct horse battery")
    assert unlocked.key.hex() == OLD_RECORD_KEY and unlocked.upgraded
    assert json.loads(path.read_text())["kdf"] == FAST_KDF.to_json()
    assert PassphraseLock(path, FAST_KDF).unlock("correct horse battery").key.hex() == OLD_RECORD_KEY
