"""The engine worker: owns the EngineSession and runs every engine call on its own QThread."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QThread, Signal, Slot

from lazykv.core.engine import EngineError, EngineSession, SamplingSettings


class EngineWorker(QObject):
    """Move to a QThread, then drive it only through queued signals (and ``cancel()``).

    Every slot runs on the worker's thread and reports back through signals, so the GUI
    thread never waits on the engine. One reply runs at a time; requests queue up in order.
    """

    model_loaded = Signal(object)  # ModelInfo
    load_failed = Signal(str)
    token = Signal(str)
    reply_finished = Signal(str, bool)  # full text, cancelled
    failed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self._session = EngineSession()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Stop the reply that is running or queued; callable from any thread.

        The request is consumed by that reply: call it only while a reply is pending.
        """
        self._cancel.set()

    @Slot(str, int, str)
    def load_model(self, path: str, n_ctx: int, kv_mode: str) -> None:
        try:
            info = self._session.load(path, n_ctx=n_ctx, kv_mode=kv_mode)
        except Exception as err:  # every failure must reach the view, or it waits forever
            self.load_failed.emit(_message(err))
        else:
            self.model_loaded.emit(info)

    @Slot(object, object, object)
    def send(
        self, messages: list[dict[str, str]], sampling: SamplingSettings, max_tokens: int | None
    ) -> None:
        """Stream a reply to ``messages``: ``token`` per piece, then ``reply_finished`` or ``failed``."""
        pieces: list[str] = []
        try:
            for piece in self._session.stream_reply(messages, sampling, self._cancel, max_tokens=max_tokens):
                pieces.append(piece)
                self.token.emit(piece)
        except Exception as err:  # as in load_model
            self.failed.emit(_message(err))
        else:
            self.reply_finished.emit("".join(pieces), self._cancel.is_set())
        finally:
            self._cancel.clear()

    @Slot()
    def shutdown(self) -> None:
        """Free the model, then end the worker's thread's event loop."""
        self._session.close()
        QThread.currentThread().quit()


def _message(err: Exception) -> str:
    """EngineError messages are written for the user; anything else is an engine bug, shown as such."""
    if isinstance(err, EngineError):
        return str(err)
    return f"unexpected engine error: {type(err).__name__}: {err}"
