"""No key or passphrase shows when an object that holds one is formatted (issue 24.10): repr, str,
logging and tracebacks (with their locals) print the objects of the app, and end up in logs and bug
reports."""

from __future__ import annotations

import base64
import io
import logging
import traceback
from concurrent.futures import Future
from pathlib import Path

import pytest

from lazykv.core.history.keys import (
    Kdf,
    KeyringTimeoutError,
    PassphraseLock,
    UnlockedPassphrase,
    database_key,
    wrapping_key,
)
from lazykv.core.history.persistence import Crypto, Persistence
from lazykv.core.history.snapshot import ENCRYPTION_KEYRING, ENCRYPTION_NONE, ENCRYPTION_PASSPHRASE
from lazykv.core.history.store import Database, Store
from lazykv.qt.worker import SetCrypto

KEY = bytes(range(0xA0, 0xC0))  # 32 bytes no text contains by chance
PASSPHRASE = "correct horse battery staple"
FAST_KDF = Kdf("argon2id", memory_kib=64, time_cost=1, lanes=1)


def _forms(secret: bytes) -> list[str]:
    """The ways bytes show up in text: their repr (whole or in part), hex, base64."""
    shown = repr(secret)
    return [shown, shown[2:26], secret.hex(), secret.hex()[:16], base64.b64encode(secret).decode()[:16]]


def _leaks(text: str, secrets: list[bytes]) -> list[str]:
    found = [form for secret in secrets for form in _forms(secret) if form in text]
    return found + ([PASSPHRASE] if PASSPHRASE in text else [])


def _formatted(obj: object) -> str:
    """``obj`` through repr, str, format, logging (the message and a logged exception) and tracebacks,
    those with the frames' locals included."""
    out = [repr(obj), str(obj), f"{obj}", f"{obj!r}", format(obj, "")]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s %(args)s"))
    log = logging.getLogger("lazykv.test.secrets")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.info("holding %s %r", obj, obj)
        log.info({"held": obj})
        try:
            held = obj  # noqa: F841 - a local that a traceback with locals prints
            raise RuntimeError(obj)
        except RuntimeError as err:
            log.exception("failed")
            out.append("".join(traceback.format_exception(err)))
            with_locals = traceback.TracebackException.from_exception(err, capture_locals=True)
            out.append("".join(with_locals.format()))
    finally:
        log.removeHandler(handler)
    out.append(stream.getvalue())
    return "\n".join(out)


def _holders(tmp_path: Path) -> list[object]:
    unlocked = PassphraseLock(tmp_path / "p.json", FAST_KDF).create(PASSPHRASE, PASSPHRASE)
    passphrase = Crypto(ENCRYPTION_PASSPHRASE, unlocked=UnlockedPassphrase(KEY))
    keyring = Crypto(ENCRYPTION_KEYRING, KEY)
    late: Future[bytes] = Future()
    late.set_result(KEY)
    store = Store(tmp_path / "s.sqlite3", tmp_path / "snaps", key=database_key(KEY))
    database = Database(tmp_path / "d.sqlite3", tmp_path / "snaps", key=database_key(KEY))
    persistence = Persistence(database, object(), tmp_path / "f.json", keyring)  # type: ignore[arg-type]
    return [
        unlocked, UnlockedPassphrase(KEY), keyring, passphrase, Crypto(ENCRYPTION_NONE),
        SetCrypto(keyring), SetCrypto(passphrase), KeyringTimeoutError("no answer", "details", late),
        store, database, persistence,
    ]


def test_no_object_that_holds_a_key_or_passphrase_shows_it_when_formatted(tmp_path: Path) -> None:
    holders = _holders(tmp_path)
    unlocked = holders[0]
    assert isinstance(unlocked, UnlockedPassphrase)
    secrets = [KEY, database_key(KEY), wrapping_key(KEY), unlocked.key, database_key(unlocked.key)]
    try:
        for obj in holders:
            text = _formatted(obj)
            assert not _leaks(text, secrets), f"{type(obj).__name__} shows {_leaks(text, secrets)}"
    finally:
        holders[-3].close()  # type: ignore[attr-defined]
        holders[-2].close(10)  # type: ignore[attr-defined]


def test_the_check_finds_a_key_that_is_shown() -> None:
    """The check above is not vacuous: a plain tuple holding the key is caught in every form."""
    assert _leaks(_formatted(("key", KEY)), [KEY])
    assert _leaks(_formatted(KEY.hex()), [KEY])
    with pytest.raises(AssertionError):
        assert not _leaks(_formatted({"passphrase": PASSPHRASE}), [])
