"""The session's protection choices, Qt-free: which answers still count, and what a key means for the
history (open it, re-encrypt it, or nothing)."""

from __future__ import annotations

from lazykv.core.history.keys import KeyringUnavailableError
from lazykv.core.history.protection import (
    KEYRING,
    PASSPHRASE,
    HistoryKey,
    Protection,
    keyring_crypto,
    keyring_problem,
    no_encryption,
)

KEY_A, KEY_B = b"a" * 32, b"b" * 32


def test_the_first_key_opens_the_history_the_same_key_keeps_it_another_re_encrypts() -> None:
    p = Protection()
    what, key, key_id = p.what_for(keyring_crypto(KEY_A))
    assert what is HistoryKey.OPEN and key is not None and key_id is not None and key_id != key.hex()
    p.opened(key_id, KEYRING)
    assert p.what_for(keyring_crypto(KEY_A))[0] is HistoryKey.KEEP
    assert p.what_for(keyring_crypto(KEY_B))[0] is HistoryKey.REKEY
    assert p.what_for(no_encryption())[0] is HistoryKey.REKEY  # plain, chosen in words: rewritten
    assert p.what_for(None)[0] is HistoryKey.KEEP  # no protection chosen: nothing changes
    p.locked()  # it did not open with that key: the next choice opens it anew
    assert p.history_locked and p.what_for(keyring_crypto(KEY_B))[0] is HistoryKey.OPEN


def test_an_answer_counts_only_for_the_choice_it_answers() -> None:
    p = Protection()
    first = p.choose()
    p.keyring_late = True  # the keyring timed out; its answer may still come
    assert p.is_current(first) and p.takes_late_key(first, KEYRING)
    assert not p.takes_late_key(first, PASSPHRASE)  # the setting changed meanwhile
    second = p.choose()
    assert not p.is_current(first) and not p.takes_late_key(first, KEYRING)
    assert not p.takes_late_key(second, KEYRING)  # a new choice waits for no late answer


def test_the_keyring_failure_is_one_sentence_with_details_apart() -> None:
    first, details = keyring_problem(KeyringUnavailableError("No keyring here.", "dbus said no"))
    assert (first, details) == ("No keyring here.", "dbus said no")
    first, details = keyring_problem(RuntimeError("boom"))
    assert first == "Your system's keyring could not be used." and "boom" in details
