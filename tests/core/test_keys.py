"""The snapshot key: OS keyring storage (in-memory and fail backends) and the passphrase KDF."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import keyring
import keyring.errors
import pytest
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from keyring.backend import KeyringBackend
from keyring.backends import fail, null

from lazykv.core import keys
from lazykv.core.keys import (
    KEY_NAME,
    SERVICE,
    KeyringUnavailableError,
    key_from_passphrase,
    keyring_available,
    load_or_create_key,
    new_salt,
)


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
    with pytest.raises(KeyringUnavailableError, match="damaged"):
        load_or_create_key()
    assert backend.secrets[(SERVICE, KEY_NAME)] == stored
    assert backend.writes == 0


@pytest.mark.parametrize("backend", [fail.Keyring(), null.Keyring()], ids=["fail", "null"])
def test_no_keyring(use_keyring: Callable[[KeyringBackend], None], backend: KeyringBackend) -> None:
    use_keyring(backend)
    assert not keyring_available()
    with pytest.raises(KeyringUnavailableError) as info:
        load_or_create_key()
    message = str(info.value)
    assert "No OS keyring" in message
    assert "passphrase" in message and "without encryption" in message


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
