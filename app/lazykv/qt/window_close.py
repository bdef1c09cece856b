"""Closing the window: nothing typed is lost (asked first when turns are not saved), the chat open
now is remembered for the next start, and the engine, the disk jobs and the database end within a
deadline."""

from __future__ import annotations

from PySide6.QtCore import QDeadlineTimer, Qt
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QMessageBox,
)

from lazykv import console
from lazykv.qt import window_state
from lazykv.qt.ui_state import APP_TITLE


class Closing:
    """The closing part of ``MainWindow`` (mixed into it: it uses the window's engine, worker thread,
    timers, database and conversations)."""

    def shutdown_engine(self) -> bool:
        """Hide the window, stop what the engine does, drop what is queued, free the model, and wait
        for the engine's thread at most ``timings.shutdown_deadline_ms``. Pending disk writes finish
        too. True when everything ended in time; safe to call more than once.

        The one place the GUI thread waits on the engine: at exit, with the window already gone."""
        if self._shut_down is not None:
            return self._shut_down
        self._shut_down = False
        self.hide()
        self.stop_downloads()
        self._sampler.stop()
        self._idle_timer.stop()
        self._keep_cut_reply()
        waiting = self.ops.labels()
        if waiting:
            console.say(f"finishing before exit: {', '.join(waiting)}")
        self._worker.close()
        self.engine.close()
        self.local_server.stop(wait=True)
        deadline = QDeadlineTimer(self.timings.shutdown_deadline_ms)
        disk_done = self.background.wait(max(0, deadline.remainingTime()))
        engine_done = not self._thread.isRunning()
        if not engine_done:
            self.shutdown_requested.emit()
            engine_done = self._thread.wait(deadline)
        if not engine_done:
            console.say("the engine did not stop in time; exiting without it")
        self.conversations.erase_pending()  # an undo does not outlive the app: erased before closing
        database_done = self.database.close(max(500, deadline.remainingTime()) / 1000)
        self._shut_down = disk_done and engine_done and database_done
        return self._shut_down

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._asked_before_losing_turns():
            event.ignore()
            return
        window_state.save(self)
        self._remember_last_conversation()
        self.shutdown_engine()
        super().closeEvent(event)

    def _remember_last_conversation(self) -> None:
        """The next start opens the chat on screen now (a private one leaves no trace: the newest then)."""
        current = None if self.conversations.private else self.conversations.current
        if self.settings.set("last_conversation", current or 0):
            self.save_settings()  # shutdown_engine waits for it

    def _asked_before_losing_turns(self) -> bool:
        """Turns that wait for the history to open would be lost by quitting: ask first (window-modal,
        the event loop runs on). True while the question stands."""
        unsaved = self.conversations.unsaved_turns()
        if not unsaved or self._losing_unsaved_ok or self._shut_down is not None:
            return False
        if self.findChild(QMessageBox, "unsaved-box") is None:
            self._ask_before_losing_turns(unsaved)
        return True

    def _ask_before_losing_turns(self, unsaved: int) -> None:
        messages, they, them = ("1 message you typed is", "it", "it") if unsaved == 1 else \
            (f"{unsaved} messages you typed are", "they", "them")
        text = (f"{messages} not saved: {self.conversations.why_unsaved()}. If you quit now, {they} will "
                "be lost.")
        box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, text, QMessageBox.StandardButton.NoButton,
                          self)
        box.setInformativeText(f"Keep the window open and {they} will be saved as soon as the history opens.")
        box.setObjectName("unsaved-box")
        lose = box.addButton(f"Quit and lose {them}", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton("Keep the window open", QMessageBox.ButtonRole.RejectRole))
        lose.clicked.connect(self._quit_losing_turns)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def _quit_losing_turns(self) -> None:
        self._losing_unsaved_ok = True
        console.say(f"quit with {self.conversations.unsaved_turns()} messages not saved "
                    f"({self.conversations.why_unsaved()})")
        self.close()
