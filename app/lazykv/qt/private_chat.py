"""Private mode of the chat on screen, for ``Conversations`` (its ``private_chat``; the flag itself is
``Conversations.private``). Ticking Private saves nothing more of the chat. Unticking it while the
chat holds private turns asks what becomes of them first (issue 45, defect 6): saved as a new chat
(its whole transcript, a normal conversation from then on), discarded (a new, empty chat with an empty
cache takes its place, so the screen, the saved history and what the model sees stay one
conversation), or Cancel (it stays private). Whatever the answer, keyboard focus goes back to the
message box: a space typed next is text, never a click on the Private box."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import SignalInstance
from PySide6.QtWidgets import QMessageBox, QWidget

from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.elided_label import StatusBar
from lazykv.qt.ui_state import APP_TITLE

if TYPE_CHECKING:
    from lazykv.qt.conversations import Chat, ChatScreen


class EndPrivate(enum.Enum):
    """The answers to "End the private chat?"; each button's object name is its value."""

    SAVE = "save-private-chat"
    DISCARD = "discard-private-chat"
    KEEP = "keep-private-chat"  # Cancel, Esc, the title bar's close button


END_PRIVATE_BOX = "end-private-box"


class PrivateOwner(Protocol):
    """What the Private switch uses of ``Conversations``: the chat on screen and its private flag."""

    chat: Chat
    private: bool
    private_changed: SignalInstance

    def persist(self, snapshot: bool) -> None: ...
    def new_chat(self, system_prompt: str) -> None: ...


class PrivateWindow(Protocol):
    """What the Private switch uses of the window."""

    conversations_panel: ConversationsPanel
    input: QWidget  # keyboard focus goes back to it

    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name
    def setting(self, name: str) -> Any: ...


class PrivateChat:
    """The Private switch of ``Conversations`` (``owner``); its question is window-modal on
    ``dialog_parent``."""

    def __init__(self, owner: PrivateOwner, window: PrivateWindow, screen: ChatScreen,
                 dialog_parent: QWidget) -> None:
        self.owner = owner
        self.window = window
        self.screen = screen
        self._dialogs = dialog_parent
        self._end_private_box: QMessageBox | None = None

    def set_private(self, private: bool) -> None:
        """Private on: nothing more of this chat is saved. Off: with private turns on screen, asked first
        (``ask_end_private``); without them, saving simply goes on. Focus returns to the message box."""
        if private != self.owner.private:
            if not private and self.owner.chat.unsaved_private_turns:
                self.ask_end_private()
                return
            self.owner.private = private
            self.owner.private_changed.emit(private)
        self._back_to_input()

    def ask_end_private(self) -> None:
        """Save the private chat as a new chat, discard it, or keep it private; window-modal, never
        blocking. Until answered, Private stays ticked (both of its controls)."""
        self.owner.private_changed.emit(True)  # the box (or menu item) just unticked shows the state again
        if self._end_private_box is not None:
            return
        chat = self.owner.chat
        n = len(chat.conversation)
        box = QMessageBox(QMessageBox.Icon.Question, APP_TITLE, "", QMessageBox.StandardButton.NoButton,
                          self._dialogs)
        box.setObjectName(END_PRIVATE_BOX)
        box.setText(f"End the private chat? Its {n} message{'s' if n != 1 else ''} "
                    f"{'were' if n != 1 else 'was'} never saved.")
        box.setInformativeText("Save it as a new chat to keep it with your conversations, or discard it. "
                               "Cancel keeps it private.")
        buttons = {
            EndPrivate.SAVE: box.addButton("Save as a new chat", QMessageBox.ButtonRole.AcceptRole),
            EndPrivate.DISCARD: box.addButton("Discard", QMessageBox.ButtonRole.DestructiveRole),
            EndPrivate.KEEP: box.addButton(QMessageBox.StandardButton.Cancel),
        }
        for answer, button in buttons.items():
            button.setObjectName(answer.value)
        box.setDefaultButton(buttons[EndPrivate.SAVE])
        box.setEscapeButton(buttons[EndPrivate.KEEP])

        def answered() -> None:
            clicked = box.clickedButton()
            answer = next((a for a, b in buttons.items() if b is clicked), EndPrivate.KEEP)
            self._end_private_box = None
            box.deleteLater()
            self.end_private(answer, chat)

        box.finished.connect(answered)
        self._end_private_box = box
        box.open()

    def end_private(self, answer: EndPrivate, chat: object | None = None) -> None:
        """Apply ``answer`` to the private chat on screen (``chat``: the one asked about; another one on
        screen by now takes no answer)."""
        if self.owner.private and (chat is None or chat is self.owner.chat):
            if answer is EndPrivate.SAVE:
                self._save_private_chat()
            elif answer is EndPrivate.DISCARD:
                self._discard_private_chat()
        self._back_to_input()

    def _save_private_chat(self) -> None:
        """The private chat becomes a new conversation, its whole transcript written as usual; a chat it
        went on from keeps only what was saved of it before Private was ticked."""
        from lazykv.qt.conversations import SavedAs  # that module imports this one

        chat = self.owner.chat
        chat.saved, chat.first_saved, chat.unsaved_private_turns = SavedAs(), 0, False
        self.owner.private = False
        self.owner.private_changed.emit(False)
        self.window.conversations_panel.select(None)  # listed and selected once written
        # a streaming reply saves one when done
        self.owner.persist(snapshot=self.screen.reply_request is None)
        self.window.statusBar().showMessage(
            "The private chat is saved as a new chat; it is saved as usual from now on.", 10_000)

    def _discard_private_chat(self) -> None:
        """The private chat ends, never written: a new, empty chat with an empty cache takes its place."""
        n = len(self.owner.chat.conversation)
        self.owner.private = False
        self.owner.private_changed.emit(False)
        self.screen.stop_reply()
        self.owner.new_chat(self.window.setting("system_prompt"))
        self.window.statusBar().showMessage(
            f"Private chat discarded: its {n} messages were not saved. This is a new chat, saved as usual.",
            10_000)

    def _back_to_input(self) -> None:
        self.window.input.setFocus()
