"""The snapshot encryption key: kept in the OS keyring, or derived from a passphrase.

The keyring key is 32 random bytes stored base64-encoded under SERVICE / KEY_NAME; it is created on
first use and never written anywhere else by the app. Keyring calls run on a thread of their own
and are given up after a timeout (an unlock prompt nobody answers must not hold anything else up,
nor the app's exit). Without a usable OS keyring (e.g. headless Linux without a Secret Service)
the user can pick a passphrase (scrypt) or save unencrypted.

A passphrase is checked before anything is written under it: ``PassphraseLock`` keeps its salt and
a verifier (an HMAC made with the derived key, which reveals nothing faster than scrypt does) in a
small owner-only file; a new passphrase must be typed twice, a wrong one can be retried.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import threading
import unicodedata
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import keyring
import keyring.errors
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from keyring.backends import chainer, fail, null

from lazykv.core.files import write_text_atomic

SERVICE = "lazykv-chat"
KEY_NAME = "snapshot-key-v1"
KEY_BYTES = 32
SALT_BYTES = 16
SCRYPT_N = 2**15
SCRYPT_R = 8
SCRYPT_P = 1
KEYRING_TIMEOUT_S = 10.0
PASSPHRASE_FILE = "passphrase.json"
_VERIFIER_LABEL = b"lazykv passphrase verifier v1"
_T = TypeVar("_T")

_NO_KEYRING = "Your system's keyring (where passwords are kept) is not available."
_NO_KEYRING_DETAILS = (
    "No OS keyring is available to keep the snapshot key: on Linux this needs a Secret Service such "
    "as GNOME Keyring or KWallet, running and unlocked."
)


class KeyringUnavailableError(Exception):
    """The OS keyring cannot hold the snapshot key; the message is meant for the user, ``details`` is
    the technical account behind it (also a note of the exception)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details
        if details:
            self.add_note(details)


class KeyringTimeoutError(KeyringUnavailableError):
    """The OS keyring did not answer in time (e.g. an unlock prompt is waiting). ``late`` is the
    question still asked: it completes with the key (or the keyring's error) if the keyring answers
    after all, e.g. once the user has unlocked it."""

    def __init__(self, message: str, details: str = "", late: Future[bytes] | None = None) -> None:
        super().__init__(message, details)
        self.late: Future[bytes] = late if late is not None else Future()


class PassphraseError(Exception):
    """A passphrase was refused; the message is meant for the user (who may try again)."""


class WrongPassphraseError(PassphraseError):
    pass


class PassphraseMismatchError(PassphraseError):
    """A new passphrase and its confirmation differ."""


def keyring_available() -> bool:
    """Whether the active keyring backend can store secrets (not the fail or null backend)."""
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring | null.Keyring):
        return False
    if isinstance(backend, chainer.ChainerBackend):
        return bool(backend.backends)
    return True


def load_or_create_key(timeout_s: float = KEYRING_TIMEOUT_S) -> bytes:
    """The 32-byte snapshot key from the OS keyring, created there on first use. The keyring is
    asked on a thread of its own: KeyringTimeoutError after ``timeout_s`` (that thread is left to
    finish or hang; it never keeps the process from exiting)."""
    return _with_timeout(_load_or_create_key, timeout_s)


def _with_timeout(fn: Callable[[], _T], timeout_s: float) -> _T:
    answer: Future[_T] = Future()

    def run() -> None:
        try:
            answer.set_result(fn())
        except BaseException as err:  # handed to the caller's thread
            answer.set_exception(err)

    threading.Thread(target=run, name="lazykv-keyring", daemon=True).start()
    try:
        return answer.result(timeout_s)
    except TimeoutError:
        if answer.done():  # the keyring's own timeout, not ours
            raise
        raise KeyringTimeoutError(
            "Your system's keyring did not answer; it may be waiting for you to unlock it.",
            f"The OS keyring did not answer within {timeout_s:g} s. Whatever it answers later is "
            "used then.",
            answer,
        ) from None


def _load_or_create_key() -> bytes:
    if not keyring_available():
        raise KeyringUnavailableError(_NO_KEYRING, _NO_KEYRING_DETAILS)
    try:
        stored = keyring.get_password(SERVICE, KEY_NAME)
        if stored is None:
            keyring.set_password(SERVICE, KEY_NAME, base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii"))
            # read back: a backend may drop it silently, and another instance may have won a race
            stored = keyring.get_password(SERVICE, KEY_NAME)
    except keyring.errors.KeyringError as e:
        raise KeyringUnavailableError(_NO_KEYRING, f"{_NO_KEYRING_DETAILS} The keyring said: {e}") from e
    if stored is None:
        raise KeyringUnavailableError(_NO_KEYRING, _NO_KEYRING_DETAILS)
    return _decode_key(stored)


def _decode_key(stored: str) -> bytes:
    try:
        key = base64.b64decode(stored, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        # never overwritten: replacing it would lose every snapshot saved with it
        raise KeyringUnavailableError(
            "The key LazyKV Chat keeps in your system's keyring is damaged, so saved conversations "
            "protected with it cannot be opened.",
            f'The snapshot key in the OS keyring ("{SERVICE}" / "{KEY_NAME}") is not {KEY_BYTES} '
            "base64-encoded bytes; it was left as it is.",
        )
    return key


def key_from_passphrase(passphrase: str, salt: bytes) -> bytes:
    """A 32-byte key from ``passphrase`` (Unicode NFC-normalized) with scrypt n=2**15, r=8, p=1."""
    if not passphrase:
        raise ValueError("the passphrase is empty")
    if len(salt) < SALT_BYTES:
        raise ValueError(f"the salt must have at least {SALT_BYTES} bytes")
    kdf = Scrypt(salt=bytes(salt), length=KEY_BYTES, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return kdf.derive(unicodedata.normalize("NFC", passphrase).encode("utf-8"))


def database_key(key: bytes) -> bytes:
    """The conversation database's key, derived from the snapshot key of the scheme the user chose
    (keyring key or passphrase key): one secret to keep, two keys that never meet."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=b"lazykv conversation database v1").derive(key)  # fmt: skip


def new_salt() -> bytes:
    """16 random bytes for key_from_passphrase (stored hex-encoded in the snapshot header)."""
    return os.urandom(SALT_BYTES)


@dataclass(frozen=True)
class UnlockedPassphrase:
    """A passphrase that was checked (or confirmed when new), its salt and the key derived from it."""

    passphrase: str
    salt: bytes
    key: bytes


class PassphraseLock:
    """The passphrase's salt and verifier in ``path`` (owner-only JSON), never the passphrase."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def is_set(self) -> bool:
        """Whether a passphrase was chosen (then ``unlock``; else ``create``)."""
        return self.path.exists()

    def create(self, passphrase: str, confirmation: str, salt: bytes | None = None) -> UnlockedPassphrase:
        """Choose a new passphrase, typed twice (PassphraseMismatchError when the two differ).
        ``salt`` keeps an existing one (snapshots saved before the verifier existed stay readable)."""
        if not passphrase:
            raise PassphraseError("The passphrase is empty.")
        if unicodedata.normalize("NFC", passphrase) != unicodedata.normalize("NFC", confirmation):
            raise PassphraseMismatchError("The two passphrases differ. Type the same one twice.")
        salt = new_salt() if salt is None else bytes(salt)
        key = key_from_passphrase(passphrase, salt)
        record = {"version": 1, "salt": salt.hex(), "verifier": _verifier(key).hex()}
        write_text_atomic(self.path, json.dumps(record))
        return UnlockedPassphrase(passphrase, salt, key)

    def unlock(self, passphrase: str) -> UnlockedPassphrase:
        """The key for ``passphrase`` if it is the one chosen; WrongPassphraseError otherwise (the user
        may try again: each try costs one scrypt derivation)."""
        salt, verifier = self._read()
        if not passphrase:
            raise WrongPassphraseError("The passphrase is empty.")
        key = key_from_passphrase(passphrase, salt)
        if not hmac.compare_digest(_verifier(key), verifier):
            raise WrongPassphraseError("That is not the passphrase of these snapshots. Try again.")
        return UnlockedPassphrase(passphrase, salt, key)

    def _read(self) -> tuple[bytes, bytes]:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
            salt, verifier = bytes.fromhex(record["salt"]), bytes.fromhex(record["verifier"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise PassphraseError(
                f"The passphrase check file {self.path} cannot be read ({err}); "
                "move it away to choose the passphrase again."
            ) from err
        if len(salt) < SALT_BYTES or len(verifier) != hashlib.sha256().digest_size:
            raise PassphraseError(
                f"The passphrase check file {self.path} is damaged; "
                "move it away to choose the passphrase again."
            )
        return salt, verifier


def _verifier(key: bytes) -> bytes:
    return hmac.new(key, _VERIFIER_LABEL, hashlib.sha256).digest()
