"""The snapshot encryption key: kept in the OS keyring, or derived from a passphrase.

The keyring key is 32 random bytes stored base64-encoded under SERVICE / KEY_NAME; it is created on
first use and never written anywhere else by the app. Without a usable OS keyring (e.g. headless
Linux without a Secret Service) the user can pick a passphrase (scrypt) or save unencrypted.
"""

from __future__ import annotations

import base64
import binascii
import os
import unicodedata

import keyring
import keyring.errors
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from keyring.backends import chainer, fail, null

SERVICE = "lazykv-chat"
KEY_NAME = "snapshot-key-v1"
KEY_BYTES = 32
SALT_BYTES = 16
SCRYPT_N = 2**15
SCRYPT_R = 8
SCRYPT_P = 1

_NO_KEYRING = (
    "No OS keyring is available to keep the snapshot key (on Linux this needs a Secret Service "
    "such as GNOME Keyring or KWallet, running and unlocked). Protect the snapshot with a "
    "passphrase instead, or save it without encryption."
)


class KeyringUnavailableError(Exception):
    """The OS keyring cannot hold the snapshot key; the message is meant for the user."""


def keyring_available() -> bool:
    """Whether the active keyring backend can store secrets (not the fail or null backend)."""
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring | null.Keyring):
        return False
    if isinstance(backend, chainer.ChainerBackend):
        return bool(backend.backends)
    return True


def load_or_create_key() -> bytes:
    """The 32-byte snapshot key from the OS keyring, created there on first use."""
    if not keyring_available():
        raise KeyringUnavailableError(_NO_KEYRING)
    try:
        stored = keyring.get_password(SERVICE, KEY_NAME)
        if stored is None:
            keyring.set_password(SERVICE, KEY_NAME, base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii"))
            # read back: a backend may drop it silently, and another instance may have won a race
            stored = keyring.get_password(SERVICE, KEY_NAME)
    except keyring.errors.KeyringError as e:
        raise KeyringUnavailableError(f"{_NO_KEYRING} (The keyring said: {e})") from e
    if stored is None:
        raise KeyringUnavailableError(_NO_KEYRING)
    return _decode_key(stored)


def _decode_key(stored: str) -> bytes:
    try:
        key = base64.b64decode(stored, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        # never overwritten: replacing it would lose every snapshot saved with it
        raise KeyringUnavailableError(
            f'The snapshot key in the OS keyring ("{SERVICE}" / "{KEY_NAME}") is damaged, so '
            "encrypted snapshots cannot be opened. Use a passphrase or save without encryption."
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


def new_salt() -> bytes:
    """16 random bytes for key_from_passphrase (stored hex-encoded in the snapshot header)."""
    return os.urandom(SALT_BYTES)
