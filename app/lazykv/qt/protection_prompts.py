"""The questions and notices of the history's protection, for ``Conversations`` (its ``prompts``):
which protection is chosen (the setting), the keyring's key read off the GUI thread, the passphrase
asked (twice when it is new) and checked off the GUI thread in a prompt that says in itself why an
answer was refused (``passphrase_prompt``), banners instead of modal questions. The choices themselves
and what a key means for the database are kept in core (``lazykv.core.history.protection``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from PySide6.QtCore import QObject, Signal, SignalInstance, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from lazykv.core.history.keys import (
    KeyringTimeoutError,
    PassphraseError,
    PassphraseMismatchError,
    UnlockedPassphrase,
    load_or_create_key,
)
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.protection import (
    KEYRING,
    NO_ENCRYPTION,
    PASSPHRASE,
    HistoryKey,
    Protection,
    keyring_crypto,
    keyring_problem,
    no_encryption,
    passphrase_crypto,
    passphrase_lock,
    unlock_or_create,
)
from lazykv.core.history.records import (
    StoreLockedError,
)
from lazykv.core.history.store import Database
from lazykv.core.settings import Settings
from lazykv.qt.background import Background
from lazykv.qt.notice_banner import NoticeBanner
from lazykv.qt.operations import EngineClient
from lazykv.qt.passphrase_prompt import PassphrasePrompt, PromptState
from lazykv.qt.worker import ChangeCrypto, Failure, SetCrypto, failure


class ProtectionOwner(Protocol):
    """What the protection's questions use of ``Conversations``: whether the history is open, the
    snapshots' switch, and the history opened (or listed) once a key is chosen."""

    history_open: bool  # opened with the scheme's key: turns can be written
    snapshots_on: bool
    snapshots_changed: SignalInstance

    def start_up(self) -> None: ...
    def refresh(self) -> None: ...
    def history_opened(self) -> None: ...


class ProtectionWindow(Protocol):
    """What the protection's questions use of the window: the setting, the banners, the engine (whose
    Persistence holds the key) and the database."""

    settings: Settings
    engine: EngineClient
    database: Database
    background: Background
    keyring_notice: NoticeBanner  # non-modal: the chat goes on while they are shown
    history_notice: NoticeBanner

    def setting(self, name: str) -> Any: ...
    def apply_settings(self, changed: dict[str, Any]) -> None: ...
    def save_settings(self) -> None: ...
    def show_error(self, title: str, message: str, details: str = "") -> QMessageBox: ...
    def show_exception(self, title: str, err: BaseException) -> QMessageBox: ...


class ProtectionPrompts(QObject):
    """Asks for the history's protection for ``Conversations`` (``owner``), its prompts window-modal on
    ``dialog_parent``; ``protection`` is the session's choices (shared with the owner). A QObject of the
    GUI thread: the keyring's late answer comes from its own thread to a slot here."""

    _keyring_answered = Signal(int, object)  # the choice it answers, Future[bytes]: after its timeout

    def __init__(self, owner: ProtectionOwner, window: ProtectionWindow, protection: Protection,
                 dialog_parent: QWidget) -> None:
        super().__init__(dialog_parent)
        self.owner = owner
        self.host = window
        self.protection = protection
        self._dialogs = dialog_parent
        self._keyring = Background(self)  # its own thread: a keyring that hangs holds up no database job
        self._keyring_answered.connect(self._use_late_key)

    def setup_crypto(self) -> None:
        """How snapshots are protected, from the setting; asks when the keyring is missing. Each call
        is a new choice: what an earlier one is still waiting for (a keyring, a passphrase check) is
        dropped when it answers."""
        scheme = self.host.setting("snapshot_encryption")
        self.protection.choose()
        if scheme == NO_ENCRYPTION:
            self._use(no_encryption())
        elif scheme == PASSPHRASE:
            self.ask_passphrase()
        else:
            self._keyring.run(load_or_create_key, self._for_this_choice(self.use_keyring_key),
                              self._for_this_choice(self._keyring_missing), "Reading the keyring")

    def _for_this_choice(self, answer: Callable[[Any], None]) -> Callable[[Any], None]:
        """``answer``, run only if no other choice was made since (a late answer must not undo it)."""
        choice = self.protection.choice

        def current(value: Any) -> None:
            if self.protection.is_current(choice):
                answer(value)

        return current

    def use_keyring_key(self, key: bytes) -> None:
        self.protection.keyring_failed = self.protection.keyring_late = False
        self.host.keyring_notice.hide()
        self._use(keyring_crypto(key))

    def _use(self, crypto: Crypto | None) -> None:
        """Hand the protection to its one owner (the worker's Persistence); keep no key here. A new key
        for a history already open re-encrypts it first, all or nothing (``_change_protection``)."""
        what, key, key_id = self.protection.what_for(crypto)
        if what is HistoryKey.REKEY:
            assert crypto is not None
            self._change_protection(crypto, key_id)
            return
        self.owner.snapshots_on = crypto is not None
        self.host.engine.submit(SetCrypto(crypto))
        self.owner.snapshots_changed.emit(self.owner.snapshots_on)
        if crypto is None:
            self._keep_typed_text_here()
            return
        scheme = self.host.setting("snapshot_encryption")
        if what is HistoryKey.OPEN:  # the session's first choice: opened with its key, listed
            self.protection.opened(key_id, scheme)
            self.host.database.set_key(key)  # queued before the list and every later job
            self.owner.start_up()
            self.owner.refresh()
        else:
            self.protection.scheme_in_use = scheme

    def _keep_typed_text_here(self, why: str = "", details: str = "") -> None:
        """No protection is chosen (no keyring, no passphrase given): a history that is not open yet
        stays closed, never opened in plain text; what is typed is kept in this window, and the banner
        says so. One already open stays under its key."""
        if self.owner.history_open or self.protection.history_locked:
            return
        self.host.history_notice.show_choices(
            f"{why} Your conversations are not saved yet: choose how to protect them. Until then what you "
            "type is kept in this window only.".strip(),
            [("Use a passphrase…", lambda: self._choose_scheme(PASSPHRASE)),
             ("Save without encryption", lambda: self._choose_scheme(NO_ENCRYPTION))],
            f"{details}\n\nNothing is written to disk in plain text unless you choose to save without "
            "encryption.".strip())

    def _change_protection(self, crypto: Crypto, key_id: str | None) -> None:
        """Re-encrypt the open history (and every snapshot key) under ``crypto`` on the worker, all or
        nothing; then use it. A failure leaves everything under the old key, says so, puts the setting
        back to the scheme in use, and can be retried by choosing again."""
        previous = self.protection.scheme_in_use
        chosen = self.host.setting("snapshot_encryption")

        def changed(_: object) -> None:
            self.protection.rekeyed(key_id, chosen)
            self.owner.snapshots_on = True
            self.owner.snapshots_changed.emit(True)

        def failed(failure: Failure) -> None:
            self.host.show_error(
                "The protection of your conversations was not changed",
                f"{failure.message}\n\nEverything is still protected as before; choose the new protection "
                "again in Settings to retry.", failure.details)
            if previous is not None and previous != self.host.setting("snapshot_encryption"):
                self.host.settings.set("snapshot_encryption", previous)
                self.host.save_settings()

        self.host.engine.submit(ChangeCrypto(crypto), self._for_this_choice(changed),
                                self._for_this_choice(failed))

    def _keyring_missing(self, err: Exception) -> None:
        """No keyring: the chat goes on (saved as the history allows, without snapshots) and a banner
        offers the other schemes; no question waits for an answer."""
        self.protection.keyring_failed = True
        if isinstance(err, KeyringTimeoutError):  # it may still answer (an unlock prompt): then use it
            self.protection.keyring_late = True
            choice = self.protection.choice
            err.late.add_done_callback(lambda answer: self._keyring_answered_late(choice, answer))
            if not self.owner.history_open:
                self._wait_for_the_keyring(err)
                return
        first, details = keyring_problem(err)
        self._use(None)
        if not self.owner.history_open:  # never opened without its key: the typed text is kept here
            self._keep_typed_text_here(first, details)
            return
        self.host.keyring_notice.show_choices(
            f"{first} Conversations are still saved; to also keep snapshots (long chats resume at "
            "once), protect them with a passphrase or save them without encryption.",
            [("Use a passphrase…", lambda: self._choose_scheme(PASSPHRASE)),
             ("Save without encryption", lambda: self._choose_scheme(NO_ENCRYPTION))],
            details)

    def _wait_for_the_keyring(self, err: KeyringTimeoutError) -> None:
        """The keyring has not answered and the history is not open: it stays closed (never opened
        without its key, so nothing is written in plain text meanwhile); the chat goes on, its turns
        kept here and written when the keyring answers, or once another choice opens the history."""
        self.owner.snapshots_on = False
        self.host.engine.submit(SetCrypto(None))
        self.owner.snapshots_changed.emit(False)
        self.host.history_notice.show_choices(
            "Your saved conversations stay closed until your system's keyring answers (it may be waiting "
            "for you to unlock it). You can chat: what you type is kept here and saved as soon as it "
            "answers.",
            [("Use a passphrase…", lambda: self._choose_scheme(PASSPHRASE)),
             ("Save without encryption", lambda: self._choose_scheme(NO_ENCRYPTION))],
            err.details)

    def _keyring_answered_late(self, choice: int, answer: Future[bytes]) -> None:
        """On the keyring's thread: hand its late answer to the GUI thread."""
        try:
            self._keyring_answered.emit(choice, answer)
        except RuntimeError:  # this window is gone
            pass

    def _choose_scheme(self, scheme: str) -> None:
        self.host.apply_settings({"snapshot_encryption": scheme})

    def history_failed(self, err: Exception) -> None:
        """Opening or listing the history failed. Encrypted under another key: said in a banner (the
        chat goes on, its turns kept here and written once the history opens); else an error."""
        if not isinstance(err, StoreLockedError):
            self.host.show_exception("The conversation history could not be opened", err)
            self.owner.history_opened()  # not locked: saves try again, and say their own errors
            return
        if self.protection.history_locked:
            return  # opening and listing both failed: one banner
        self.owner.history_open = False
        self.protection.locked()  # the next scheme chosen opens it anew (set_key, not change_key)
        self.host.history_notice.show_choices(
            "Your saved conversations are locked: they were protected with another key (another "
            "keyring, or a passphrase). You can chat: what you type is kept here and saved once they "
            "are unlocked.",
            [(label, lambda scheme=scheme: self._choose_scheme(scheme)) for scheme, label in
             ((PASSPHRASE, "Unlock with a passphrase…"), (KEYRING, "Use the keyring"))
             if scheme != self.host.setting("snapshot_encryption")],
            str(err))

    def ask_passphrase(self, problem: str = "") -> None:
        """The passphrase prompt (``problem``: why it is asked again, said in it). A wrong answer is
        said in the prompt itself, which stays open for the retry: no other window comes up."""
        prompt = self._passphrase_prompt("passphrase-dialog", "Snapshot passphrase",
                                         "Passphrase for this session's conversation snapshots:")
        use = self._for_this_choice(self._use)  # for this choice only (a later one may come first)
        prompt.rejected.connect(lambda: use(None))  # no passphrase: no snapshots, history as it is
        prompt.submitted.connect(lambda text: self.use_passphrase(text, prompt=prompt))
        if problem:
            prompt.refuse(problem)

    def use_passphrase(self, passphrase: str, confirmation: str | None = None,
                       prompt: PassphrasePrompt | None = None) -> None:
        """Unlock with the chosen passphrase (a wrong one is said in ``prompt``, asked again), or choose
        it, typed twice: nothing is ever written under an unchecked passphrase."""
        state = prompt.state if prompt is not None else PromptState()
        if not passphrase:
            self._close_prompt(prompt)
            self._use(None)
            return
        lock = passphrase_lock()
        if not lock.is_set() and confirmation is None:
            self._close_prompt(prompt)
            self._confirm_passphrase(passphrase)
            return
        salt_hex = self.host.settings["passphrase_salt"]  # kept: snapshots saved before the verifier

        def check() -> UnlockedPassphrase:
            return unlock_or_create(lock, passphrase, confirmation, salt_hex)

        choice = self.protection.choice

        def refused(err: Exception) -> None:
            if state.closed:  # cancelled while it was checked: no passphrase, as its Cancel said
                return
            if not self.protection.is_current(choice):  # another choice was made meanwhile
                self._close_prompt(prompt)
                return
            if isinstance(err, PassphraseError) and not isinstance(err, PassphraseMismatchError) and prompt:
                prompt.refuse(failure(err).message)  # in the prompt, which stays for the retry
                return
            self._close_prompt(prompt)
            if isinstance(err, PassphraseError):  # differing twice typed, or no prompt open: asked anew
                self.ask_passphrase(failure(err).message)
            else:
                self.host.show_exception("The passphrase was not accepted", err)

        def accepted(unlocked: UnlockedPassphrase) -> None:
            if state.closed:
                return
            self._close_prompt(prompt)
            if self.protection.is_current(choice):
                self._use(passphrase_crypto(unlocked))

        self.host.background.run(check, accepted, refused, "Checking the passphrase")

    @staticmethod
    def _close_prompt(prompt: PassphrasePrompt | None) -> None:
        if prompt is not None:
            prompt.finish()

    def _confirm_passphrase(self, passphrase: str) -> None:
        prompt = self._passphrase_prompt("passphrase-confirm-dialog", "Confirm the passphrase",
                                         "Type the new passphrase again:")
        use = self._for_this_choice(self._use)
        prompt.rejected.connect(lambda: use(None))
        prompt.submitted.connect(lambda again: self.use_passphrase(passphrase, again, prompt))

    def _passphrase_prompt(self, name: str, title: str, label: str) -> PassphrasePrompt:
        prompt = PassphrasePrompt(self._dialogs, name, title, label)
        prompt.open()
        return prompt

    @Slot(int, object)
    def _use_late_key(self, choice: int, answer: Future[bytes]) -> None:
        """The keyring answered after its timeout (e.g. once unlocked): its key is used now, unless
        another choice was made meanwhile; a history it locked opens and what waited is written."""
        if not self.protection.takes_late_key(choice, self.host.setting("snapshot_encryption")):
            return
        if answer.exception() is None:
            self.use_keyring_key(answer.result())
