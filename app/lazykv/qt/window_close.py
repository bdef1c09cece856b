"""Closing the window: nothing typed is lost (asked first when turns are not saved), the chat open
now is remembered for the next start, and the engine, the disk jobs and the database end within a
deadline. ``Closing`` sees the window only through ``ClosingHost``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import QDeadlineTimer, Qt, QThread, SignalInstance
from PySide6.QtWidgets import (
    QMessageBox,
    QWidget,
)

from lazykv import console
from lazykv.core.history.store import Database
from lazykv.core.settings import Settings
from lazykv.qt.background import Background
from lazykv.qt.local_server import LocalServerSwitch
from lazykv.qt.operations import EngineClient, Operations
from lazykv.qt.tool_flow import ToolCalls
from lazykv.qt.ui_state import APP_TITLE
from lazykv.qt.worker import EngineWorker

if TYPE_CHECKING:
    from lazykv.qt.conversations import Conversations


class ClosingHost(Protocol):
    """What closing uses of its window: what runs (engine, disk jobs, server, database) and the chat."""

    settings: Settings
    conversations: Conversations
    ops: Operations
    engine: EngineClient
    background: Background
    database: Database
    local_server: LocalServerSwitch
    tool_calls: ToolCalls
    shutdown_requested: SignalInstance  # to the worker: free the model, end the thread

    @property
    def worker(self) -> EngineWorker: ...
    @property
    def engine_thread(self) -> QThread: ...
    def hide(self) -> None: ...
    def close(self) -> bool: ...
    def stop_activity(self) -> None: ...  # the window's own timers, downloads, a streaming reply kept
    def save_settings(self) -> None: ...


class Closing:
    """Ends the window's session: asks before turns that are not saved would be lost, remembers the chat
    on screen, and stops the engine, the disk jobs and the database within ``deadline_ms``."""

    def __init__(self, host: ClosingHost, dialog_parent: QWidget, deadline_ms: int) -> None:
        self.host = host
        self._dialogs = dialog_parent
        self._deadline_ms = deadline_ms
        self._shut_down: bool | None = None  # after shutdown_engine: whether everything ended in time
        self._losing_unsaved_ok = False  # the user chose to quit although turns are not saved

    def shutdown_engine(self) -> bool:
        """Hide the window, stop what the engine does, drop what is queued, free the model, and wait
        for the engine's thread at most ``deadline_ms``. Pending disk writes finish too. True when
        everything ended in time; safe to call more than once.

        The one place the GUI thread waits on the engine: at exit, with the window already gone."""
        if self._shut_down is not None:
            return self._shut_down
        self._shut_down = False
        host = self.host
        host.hide()
        host.stop_activity()
        waiting = host.ops.labels()
        if waiting:
            console.say(f"finishing before exit: {', '.join(waiting)}")
        host.worker.close()
        host.engine.close()
        host.local_server.stop(wait=True)
        if host.tool_calls.hub is not None:
            host.tool_calls.hub.close()  # bounded: a server that ignores its end is killed
        deadline = QDeadlineTimer(self._deadline_ms)
        disk_done = host.background.wait(max(0, deadline.remainingTime()))
        thread = host.engine_thread
        engine_done = not thread.isRunning()
        if not engine_done:
            host.shutdown_requested.emit()
            engine_done = thread.wait(deadline)
        if not engine_done:
            console.say("the engine did not stop in time; exiting without it")
        host.conversations.erase_pending()  # an undo does not outlive the app: erased before closing
        database_done = host.database.close(max(500, deadline.remainingTime()) / 1000)
        self._shut_down = disk_done and engine_done and database_done
        return self._shut_down

    def remember_last_conversation(self) -> None:
        """The next start opens the chat on screen now (a private one leaves no trace: the newest then)."""
        conversations = self.host.conversations
        current = None if conversations.private else conversations.current
        if self.host.settings.set("last_conversation", current or 0):
            self.host.save_settings()  # shutdown_engine waits for it

    def asked_before_losing_turns(self) -> bool:
        """Turns that wait for the history to open would be lost by quitting: ask first (window-modal,
        the event loop runs on). True while the question stands."""
        unsaved = self.host.conversations.unsaved_turns()
        if not unsaved or self._losing_unsaved_ok or self._shut_down is not None:
            return False
        if self._dialogs.findChild(QMessageBox, "unsaved-box") is None:
            self._ask_before_losing_turns(unsaved)
        return True

    def _ask_before_losing_turns(self, unsaved: int) -> None:
        messages, they, them = ("1 message you typed is", "it", "it") if unsaved == 1 else \
            (f"{unsaved} messages you typed are", "they", "them")
        text = (f"{messages} not saved: {self.host.conversations.why_unsaved()}. If you quit now, {they} "
                "will be lost.")
        box = QMessageBox(QMessageBox.Icon.Warning, APP_TITLE, text, QMessageBox.StandardButton.NoButton,
                          self._dialogs)
        box.setInformativeText(f"Keep the window open and {they} will be saved as soon as the history opens.")
        box.setObjectName("unsaved-box")
        lose = box.addButton(f"Quit and lose {them}", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton("Keep the window open", QMessageBox.ButtonRole.RejectRole))
        lose.clicked.connect(self._quit_losing_turns)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()

    def _quit_losing_turns(self) -> None:
        self._losing_unsaved_ok = True
        conversations = self.host.conversations
        console.say(f"quit with {conversations.unsaved_turns()} messages not saved "
                    f"({conversations.why_unsaved()})")
        self.host.close()
