"""Private mode of the chat on screen, for ``Conversations`` (mixed into it: it uses its chat, host and
signals). Ticking Private saves nothing more of the chat. Unticking it while the chat holds private
turns asks what becomes of them first (issue 45, defect 6): saved as a new chat (its whole transcript,
a normal conversation from then on), discarded (a new, empty chat with an empty cache takes its place,
so the screen, the saved history and what the model sees stay one conversation), or Cancel (it stays
private). Whatever the answer, keyboard focus goes back to the message box: a space typed next is text,
never a click on the Private box."""

from __future__ import annotations

import enum

from PySide6.QtWidgets import QMessageBox

from lazykv.qt.ui_state import APP_TITLE


class EndPrivate(enum.Enum):
    """The answers to "End the private chat?"; each button's object name is its value."""

    SAVE = "save-private-chat"
    DISCARD = "discard-private-chat"
    KEEP = "keep-private-chat"  # Cancel, Esc, the title bar's close button


END_PRIVATE_BOX = "end-private-box"


class PrivateChat:
    """The Private switch of ``Conversations``."""

    _end_private_box: QMessageBox | None = None

    def set_private(self, private: bool) -> None:
        """Private on: nothing more of this chat is saved. Off: with private turns on screen, asked first
        (``ask_end_private``); without them, saving simply goes on. Focus returns to the message box."""
        if private != self.private:
            if not private and self.chat.unsaved_private_turns:
                self.ask_end_private()
                return
            self.private = private
            self.private_changed.emit(private)
        self._back_to_input()

    def ask_end_private(self) -> None:
        """Save the private chat as a new chat, discard it, or keep it private; window-modal, never
        blocking. Until answered, Private stays ticked (both of its controls)."""
        self.private_changed.emit(True)  # the box (or menu item) just unticked shows the state again
        if self._end_private_box is not None:
            return
        chat = self.chat
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
        if self.private and (chat is None or chat is self.chat):
            if answer is EndPrivate.SAVE:
                self._save_private_chat()
            elif answer is EndPrivate.DISCARD:
                self._discard_private_chat()
        self._back_to_input()

    def _save_private_chat(self) -> None:
        """The private chat becomes a new conversation, its whole transcript written as usual; a chat it
        went on from keeps only what was saved of it before Private was ticked."""
        from lazykv.qt.conversations import SavedAs  # that module mixes this one in

        chat = self.chat
        chat.saved, chat.first_saved, chat.unsaved_private_turns = SavedAs(), 0, False
        self.private = False
        self.private_changed.emit(False)
        self.host.conversations_panel.select(None)  # listed and selected once written
        self.persist(snapshot=self.screen.reply_request is None)  # a streaming reply saves one when done
        self.host.statusBar().showMessage(
            "The private chat is saved as a new chat; it is saved as usual from now on.", 10_000)

    def _discard_private_chat(self) -> None:
        """The private chat ends, never written: a new, empty chat with an empty cache takes its place."""
        n = len(self.chat.conversation)
        self.private = False
        self.private_changed.emit(False)
        self.screen.stop_reply()
        self.new_chat(self.host.setting("system_prompt"))
        self.host.statusBar().showMessage(
            f"Private chat discarded: its {n} messages were not saved. This is a new chat, saved as usual.",
            10_000)

    def _back_to_input(self) -> None:
        self.host.input.setFocus()
