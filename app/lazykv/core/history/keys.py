"""The master key of the history and snapshots: kept in the OS keyring, or unwrapped with a passphrase.

The keyring key is 32 random bytes stored base64-encoded under SERVICE / KEY_NAME; it is created on
first use and never written anywhere else by the app. Keyring calls run on a thread of their own
and are given up after a timeout (an unlock prompt nobody answers must not hold anything else up,
nor the app's exit). Without a usable OS keyring (e.g. headless Linux without a Secret Service)
the user can pick a passphrase or save unencrypted.

A passphrase is checked before anything is written under it: ``PassphraseLock`` keeps a small
owner-only record of the KDF (Argon2id) with its parameters, a salt and the master key wrapped
under the key derived from the passphrase (the wrapping's tag is the verifier: it reveals nothing
faster than the KDF does); a new passphrase must be typed twice, a wrong one can be retried.
Records of older releases (scrypt N=2**15) still open and are upgraded at their next unlock.
No object here shows a key or a passphrase in its repr.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import keyring
import keyring.errors
from argon2.low_level import Type, hash_secret_raw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
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
NONCE_BYTES = 12
TAG_BYTES = 16
_VERIFIER_LABEL = b"lazykv passphrase verifier v1"
_RECORD_LABEL = b"lazykv passphrase record v2|"
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


def key_from_passphrase(passphrase: str, salt: bytes, kdf: Kdf | None = None) -> bytes:
    """A 32-byte key from ``passphrase`` (Unicode NFC-normalized) with ``kdf`` (Argon2id by default)."""
    return (kdf or ARGON2ID).derive(passphrase, salt)


def database_key(key: bytes) -> bytes:
    """The conversation database's key, derived from the master key of the scheme the user chose
    (keyring key or passphrase key): one secret to keep, keys that never meet."""
    return _subkey(key, b"lazykv conversation database v1")


def wrapping_key(key: bytes) -> bytes:
    """The key that wraps each snapshot's own key (see ``Crypto.wrap``), derived from the master key."""
    return _subkey(key, b"lazykv snapshot key wrapping v1")


def _subkey(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(key)


def new_salt() -> bytes:
    """16 random bytes for a passphrase KDF."""
    return os.urandom(SALT_BYTES)


@dataclass(frozen=True)
class Kdf:
    """A passphrase KDF and its parameters. They are stored with each passphrase record, so a record
    opens with the parameters it was made with, whatever the defaults are now."""

    name: str  # ARGON2ID_NAME or SCRYPT_NAME
    memory_kib: int = 0  # Argon2id: memory in KiB
    time_cost: int = 0  # Argon2id: passes
    lanes: int = 1  # Argon2id: parallelism; scrypt: p
    n: int = 0  # scrypt: CPU/memory cost
    r: int = 0  # scrypt: block size

    def derive(self, passphrase: str, salt: bytes) -> bytes:
        if not passphrase:
            raise ValueError("the passphrase is empty")
        if len(salt) < SALT_BYTES:
            raise ValueError(f"the salt must have at least {SALT_BYTES} bytes")
        secret = unicodedata.normalize("NFC", passphrase).encode("utf-8")
        if self.name == SCRYPT_NAME:
            return Scrypt(salt=bytes(salt), length=KEY_BYTES, n=self.n, r=self.r, p=self.lanes).derive(secret)
        return hash_secret_raw(secret, bytes(salt), time_cost=self.time_cost, memory_cost=self.memory_kib,
                               parallelism=self.lanes, hash_len=KEY_BYTES, type=Type.ID)  # fmt: skip

    def to_json(self) -> dict[str, int | str]:
        if self.name == SCRYPT_NAME:
            return {"name": self.name, "n": self.n, "r": self.r, "p": self.lanes}
        return {"name": self.name, "m": self.memory_kib, "t": self.time_cost, "p": self.lanes}

    @classmethod
    def from_json(cls, obj: object) -> Kdf:
        """The parameters of a stored record, in sane bounds (ValueError otherwise: a damaged file
        must not make the app allocate terabytes)."""
        if not isinstance(obj, dict) or not all(isinstance(v, int) for k, v in obj.items() if k != "name"):
            raise ValueError("the KDF parameters are not a JSON object of integers")
        if obj.get("name") == SCRYPT_NAME and set(obj) == {"name", "n", "r", "p"}:
            n, r, p = obj["n"], obj["r"], obj["p"]
            if n < 2 or n & (n - 1) or n > 2**22 or not 1 <= r <= 32 or not 1 <= p <= 16:
                raise ValueError("the scrypt parameters are out of range")
            return cls(SCRYPT_NAME, n=n, r=r, lanes=p)
        if obj.get("name") == ARGON2ID_NAME and set(obj) == {"name", "m", "t", "p"}:
            m, t, p = obj["m"], obj["t"], obj["p"]
            if not 1 <= p <= 64 or not 8 * p <= m <= 4 * 1024 * 1024 or not 1 <= t <= 64:
                raise ValueError("the Argon2id parameters are out of range")
            return cls(ARGON2ID_NAME, memory_kib=m, time_cost=t, lanes=p)
        raise ValueError("unknown KDF")


ARGON2ID_NAME, SCRYPT_NAME = "argon2id", "scrypt"
# OWASP's floor for Argon2id is m=19 MiB, t=2, p=1; a desktop affords more: 64 MiB, 3 passes (about
# 0.2 s on one core of a 2020s laptop), one lane so the time does not depend on the cores there are
ARGON2ID = Kdf(ARGON2ID_NAME, memory_kib=64 * 1024, time_cost=3, lanes=1)
# what passphrase records of version 1 used (below current guidance: upgraded at their next unlock)
LEGACY_SCRYPT = Kdf(SCRYPT_NAME, n=SCRYPT_N, r=SCRYPT_R, lanes=SCRYPT_P)


@dataclass(frozen=True)
class UnlockedPassphrase:
    """A passphrase that was checked (or confirmed when new): the master key it unwraps. The
    passphrase itself is not kept; the key never shows in a repr (logs, tracebacks)."""

    key: bytes = field(repr=False)
    upgraded: bool = False  # the record was rewritten with the current KDF at this unlock

    def __repr__(self) -> str:
        return f"UnlockedPassphrase(key=<{len(self.key)} bytes hidden>, upgraded={self.upgraded})"


class PassphraseLock:
    """The passphrase record in ``path`` (owner-only JSON), never the passphrase.

    Version 2 (written now): the KDF and its parameters, a salt, and the master key wrapped (AES-GCM)
    under the key the KDF derives from the passphrase: the tag is the verifier, and a passphrase or
    KDF change rewraps the master key without touching the data it protects. Version 1 (older
    releases): scrypt N=2**15 and an HMAC verifier, the derived key being the master key itself; it
    still opens, and is rewritten as version 2 (same master key) at its first unlock. ``kdf`` is what
    new and upgraded records use (tests pass cheaper parameters).
    """

    def __init__(self, path: Path, kdf: Kdf = ARGON2ID) -> None:
        self.path = Path(path)
        self.kdf = kdf

    def is_set(self) -> bool:
        """Whether a passphrase was chosen (then ``unlock``; else ``create``)."""
        return self.path.exists()

    def create(
        self, passphrase: str, confirmation: str, legacy_salt: bytes | None = None
    ) -> UnlockedPassphrase:
        """Choose a new passphrase, typed twice (PassphraseMismatchError when the two differ). A new
        master key is random; with ``legacy_salt`` (a passphrase chosen before records existed) it is
        what scrypt derived with that salt, so what was saved under it stays readable."""
        if not passphrase:
            raise PassphraseError("The passphrase is empty.")
        if unicodedata.normalize("NFC", passphrase) != unicodedata.normalize("NFC", confirmation):
            raise PassphraseMismatchError("The two passphrases differ. Type the same one twice.")
        if legacy_salt is None:
            master = os.urandom(KEY_BYTES)
        else:
            master = LEGACY_SCRYPT.derive(passphrase, bytes(legacy_salt))
        self._write(passphrase, master)
        return UnlockedPassphrase(master)

    def unlock(self, passphrase: str) -> UnlockedPassphrase:
        """The master key if ``passphrase`` is the one chosen; WrongPassphraseError otherwise (the user
        may try again: each try costs one KDF run). A record made with another KDF than ``kdf``
        (version 1's scrypt, older parameters) is rewritten with ``kdf`` now, atomically (a failure to
        write it is tried again next time: the old record still opens)."""
        record = self._read()
        if not passphrase:
            raise WrongPassphraseError("The passphrase is empty.")
        if record.version == 1:
            master = record.kdf.derive(passphrase, record.salt)
            if not hmac.compare_digest(_verifier(master), record.wrapped):
                raise _wrong()
        else:
            kek = AESGCM(record.kdf.derive(passphrase, record.salt))
            try:
                master = kek.decrypt(record.nonce, record.wrapped, _record_aad(record.kdf, record.salt))
            except InvalidTag:
                raise _wrong() from None
        if record.version == 2 and record.kdf == self.kdf:
            return UnlockedPassphrase(master)
        try:
            self._write(passphrase, master)
        except OSError:
            return UnlockedPassphrase(master)
        return UnlockedPassphrase(master, upgraded=True)

    def _write(self, passphrase: str, master: bytes) -> None:
        salt, nonce = new_salt(), os.urandom(NONCE_BYTES)
        kek = AESGCM(self.kdf.derive(passphrase, salt))
        wrapped = kek.encrypt(nonce, master, _record_aad(self.kdf, salt))
        record = {"version": 2, "kdf": self.kdf.to_json(), "salt": salt.hex(), "nonce": nonce.hex(),
                  "wrapped": wrapped.hex()}  # fmt: skip
        write_text_atomic(self.path, json.dumps(record))

    def _read(self) -> _Record:
        try:
            obj = json.loads(self.path.read_text(encoding="utf-8"))
            if obj["version"] == 1:
                record = _Record(1, LEGACY_SCRYPT, bytes.fromhex(obj["salt"]), b"",
                                 bytes.fromhex(obj["verifier"]))  # fmt: skip
            elif obj["version"] == 2:
                record = _Record(2, Kdf.from_json(obj["kdf"]), bytes.fromhex(obj["salt"]),
                                 bytes.fromhex(obj["nonce"]), bytes.fromhex(obj["wrapped"]))  # fmt: skip
            else:
                raise ValueError(f"unknown version {obj['version']!r}")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise PassphraseError(
                f"The passphrase check file {self.path} cannot be read ({err}); "
                "move it away to choose the passphrase again."
            ) from err
        expected = hashlib.sha256().digest_size if record.version == 1 else KEY_BYTES + TAG_BYTES
        if len(record.salt) < SALT_BYTES or len(record.wrapped) != expected or (
                record.version == 2 and len(record.nonce) != NONCE_BYTES):
            raise PassphraseError(
                f"The passphrase check file {self.path} is damaged; "
                "move it away to choose the passphrase again."
            )
        return record


@dataclass(frozen=True)
class _Record:
    version: int
    kdf: Kdf
    salt: bytes
    nonce: bytes  # version 2
    wrapped: bytes  # version 2: the wrapped master key and its tag; version 1: the HMAC verifier


def _record_aad(kdf: Kdf, salt: bytes) -> bytes:
    """What the wrapped master key is bound to: the record's version, KDF parameters and salt."""
    return _RECORD_LABEL + json.dumps(kdf.to_json(), sort_keys=True).encode() + salt


def _wrong() -> WrongPassphraseError:
    return WrongPassphraseError("That is not the passphrase of these snapshots. Try again.")


def _verifier(key: bytes) -> bytes:
    return hmac.new(key, _VERIFIER_LABEL, hashlib.sha256).digest()
