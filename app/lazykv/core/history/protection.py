"""How this session protects the history and its snapshots (Qt-free): the scheme the user chose, the
key it gives, and what a key means for the database.

The window asks (dialogs, banners) and runs the blocking calls on its own threads; the local API's
set-up asks in the terminal. Both build their ``Crypto`` here, and the window keeps its choices in a
``Protection``: which choice an answer belongs to (a late one never undoes a later choice), which key
the database was opened with (a digest: the GUI keeps no key), and whether a new key opens the
history or re-encrypts it.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from lazykv.core.history.keys import (
    PASSPHRASE_FILE,
    KeyringUnavailableError,
    PassphraseLock,
    UnlockedPassphrase,
)
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import ENCRYPTION_KEYRING, ENCRYPTION_NONE, ENCRYPTION_PASSPHRASE
from lazykv.core.paths import data_dir

# the snapshot_encryption setting's values (settings.SNAPSHOT_CHOICES)
KEYRING, PASSPHRASE, NO_ENCRYPTION = "keyring", "passphrase", "none"
_UNOPENED = object()


def keyring_crypto(key: bytes) -> Crypto:
    return Crypto(ENCRYPTION_KEYRING, key)


def passphrase_crypto(unlocked: UnlockedPassphrase) -> Crypto:
    return Crypto(ENCRYPTION_PASSPHRASE, unlocked=unlocked)


def no_encryption() -> Crypto:
    """Chosen in so many words: the history and the snapshots are written in plain text."""
    return Crypto(ENCRYPTION_NONE)


def passphrase_lock(folder: Path | None = None) -> PassphraseLock:
    """The passphrase's verifier in the data folder."""
    return PassphraseLock((folder or data_dir()) / PASSPHRASE_FILE)


def unlock_or_create(lock: PassphraseLock, passphrase: str, confirmation: str | None,
                     salt_hex: str = "") -> UnlockedPassphrase:
    """Unlock with the passphrase set before (PassphraseError when it is not that one), or set it,
    typed twice (``salt_hex``: the salt of snapshots saved before there was a verifier). Slow (the key
    derivation): run it off the GUI thread."""
    if lock.is_set():
        return lock.unlock(passphrase)
    return lock.create(passphrase, confirmation or "", bytes.fromhex(salt_hex) if salt_hex else None)


def keyring_problem(err: Exception) -> tuple[str, str]:
    """What the keyring's failure means for the user, in one sentence, and the details."""
    if isinstance(err, KeyringUnavailableError):
        return str(err), err.details
    return "Your system's keyring could not be used.", f"The OS keyring failed: {err}"


class HistoryKey(enum.Enum):
    """What a protection means for the database."""

    OPEN = enum.auto()  # the session's first key (or the first since it was found locked): open with it
    REKEY = enum.auto()  # another key for a history already open: re-encrypt it first, all or nothing
    KEEP = enum.auto()  # the key it has, or no protection: nothing changes in the database


@dataclass
class Protection:
    """The session's choices of protection, and what the database holds. ``choose`` starts a choice;
    an answer applies only while ``is_current`` says that its choice is still the last one."""

    keyring_failed: bool = False  # the OS keyring could not give the key this session
    keyring_late: bool = False  # the keyring timed out; its late answer is still awaited
    history_locked: bool = False  # encrypted under another key: nothing is saved until it opens
    scheme_in_use: str | None = None  # the scheme whose key protects the history now
    _choice: int = 0
    _history_key: object = field(default=_UNOPENED, repr=False)  # a digest, None (plain) or unopened

    def choose(self) -> int:
        """A new choice (the setting changed, or was applied again): earlier answers are dropped."""
        self._choice += 1
        self.keyring_late = False
        return self._choice

    @property
    def choice(self) -> int:
        return self._choice

    def is_current(self, choice: int) -> bool:
        return choice == self._choice

    def what_for(self, crypto: Crypto | None) -> tuple[HistoryKey, bytes | None, str | None]:
        """What ``crypto`` means for the database, with its key and that key's digest."""
        key = crypto.database_key() if crypto is not None else None
        key_id = None if key is None else hashlib.sha256(key).hexdigest()
        if crypto is None:
            return HistoryKey.KEEP, None, None
        if self._history_key is _UNOPENED:
            return HistoryKey.OPEN, key, key_id
        return (HistoryKey.KEEP if key_id == self._history_key else HistoryKey.REKEY), key, key_id

    def opened(self, key_id: str | None, scheme: str) -> None:
        """The database is opened with this key (queued before every later job)."""
        self._history_key, self.scheme_in_use, self.history_locked = key_id, scheme, False

    def rekeyed(self, key_id: str | None, scheme: str) -> None:
        self._history_key, self.scheme_in_use = key_id, scheme

    def locked(self) -> None:
        """The history did not open with the key given: the next protection chosen opens it anew."""
        self.history_locked = True
        self._history_key = _UNOPENED

    def takes_late_key(self, choice: int, scheme: str) -> bool:
        """The keyring answered after its timeout: its key is used if nothing else was chosen since."""
        return self.is_current(choice) and self.keyring_late and scheme == KEYRING
