"""The snapshot key: OS keyring storage (in-memory and fail backends) and the passphrase KDF."""

from __future__ import annotations

import base64
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
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from keyring.backend import KeyringBackend
from keyring.backends import fail, null

from lazykv.core.history import keys
from lazykv.core.history.keys import (
    KEY_NAME,
    SERVICE,
    KeyringTimeoutError,
    KeyringUnavailableError,
    PassphraseError,
    PassphraseLock,
    PassphraseMismatchError,
    WrongPassphraseError,
    key_from_passphrase,
    keyring_available,
    load_or_create_key,
    new_salt,
)
from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Database
from tests.support.history import stored_messages


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
    key = key_from_passphrase("correct horse", salt)
    assert len(key) == 32
    assert key_from_passphrase("correct horse", salt) == key
    assert key_from_passphrase("correct horse", b"\x01" + bytes(15)) != key
    assert key_from_passphrase("correct horsf", salt) != key


def test_passphrase_is_unicode_normalized() -> None:
    salt = b"s" * 16
    assert key_from_passphrase("caf\u00e9", salt) == key_from_passphrase("cafe\u0301", salt)


def test_passphrase_kdf_parameters() -> None:
    assert (keys.SCRYPT_N, keys.SCRYPT_R, keys.SCRYPT_P) == (2**15, 8, 1)
    salt = b"0123456789abcdef"
    expected = Scrypt(salt=salt, length=32, n=2**15, r=8, p=1).derive(b"pw")
    assert key_from_passphrase("pw", salt) == expected


def test_passphrase_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        key_from_passphrase("", bytes(16))
    with pytest.raises(ValueError):
        key_from_passphrase("pw", bytes(8))


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
    lock = PassphraseLock(tmp_path / "sub" / "passphrase.json")
    assert not lock.is_set()
    with pytest.raises(PassphraseMismatchError, match="differ"):
        lock.create("correct horse", "correct hrose")
    assert not lock.is_set()
    unlocked = lock.create("correct horse", "correct horse")
    assert lock.is_set() and unlocked.key == key_from_passphrase("correct horse", unlocked.salt)
    assert stat.S_IMODE(lock.path.stat().st_mode) == 0o600
    assert b"horse" not in lock.path.read_bytes()


def test_a_typo_is_refused_and_the_right_passphrase_can_be_retried(tmp_path: Path) -> None:
    lock = PassphraseLock(tmp_path / "passphrase.json")
    chosen = lock.create("correct horse", "correct horse")
    for typo in ("correct hrose", "Correct horse", ""):
        with pytest.raises(WrongPassphraseError):
            lock.unlock(typo)
    again = lock.unlock("correct horse")
    assert again == chosen


def test_an_existing_salt_is_kept_for_older_snapshots(tmp_path: Path) -> None:
    salt = bytes(range(16))
    unlocked = PassphraseLock(tmp_path / "p.json").create("pw", "pw", salt)
    assert unlocked.salt == salt and PassphraseLock(tmp_path / "p.json").unlock("pw").salt == salt


def test_a_damaged_passphrase_file_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "passphrase.json"
    path.write_text("{not json")
    with pytest.raises(PassphraseError, match="move it away"):
        PassphraseLock(path).unlock("pw")
