"""The engine worker: owns the EngineSession and runs every engine call on its own QThread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, QThread, Signal, Slot

from lazykv.core.engine import (
    ConversionEvent,
    EngineError,
    EngineSession,
    ReplyResult,
    SamplingSettings,
)
from lazykv.core.persistence import Crypto, Persistence
from lazykv.core.snapshot import SnapshotError
from lazykv.core.store import Store, StoreError, data_dir

STATUS_INTERVAL_S = 0.1  # kv_status while streaming, at most this often


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    n_ctx: int = 4096
    kv_mode: str = "lazy"
    n_threads: int = 0  # 0: one per core
    n_gpu_layers: int = 0
    flash_attn: bool = True


@dataclass(frozen=True)
class ReplyOptions:
    max_tokens: int | None = None
    context_full: str = "stop"


class EngineWorker(QObject):
    """Move to a QThread, then drive it only through queued signals (and ``cancel()``).

    Every slot runs on the worker's thread and reports back through signals, so the GUI
    thread never waits on the engine. Requests queue up and run one at a time, in order.
    """

    model_loaded = Signal(object)  # ModelInfo
    load_failed = Signal(str)
    token = Signal(str)
    reply_finished = Signal(object)  # ReplyResult
    failed = Signal(str)
    kv_status = Signal(object)  # KvStatus, after loads, while streaming, after replies and conversions
    conversion = Signal(object)  # ConversionEvent, also when a conversion happens inside a reply
    converted = Signal(bool)  # answer to convert_now: whether anything was converted
    snapshot_saved = Signal(int, object)  # conversation id, SaveResult
    snapshot_failed = Signal(int, str)
    rebuild_progress = Signal(int, int)  # tokens read, tokens to read
    conversation_opened = Signal(int, object)  # conversation id, OpenResult
    open_failed = Signal(int, str)

    def __init__(self) -> None:
        super().__init__()
        self._session = EngineSession()
        self._session.set_conversion_listener(self._on_conversion)
        self._cancel = threading.Event()
        self._crypto: Crypto | None = None  # None: snapshots are not saved
        self._persistence: Persistence | None = None

    def cancel(self) -> None:
        """Stop the reply that is running or queued; callable from any thread.

        The request is consumed by that reply: call it only while a reply is pending.
        """
        self._cancel.set()

    @Slot(object)
    def load_model(self, config: EngineConfig) -> None:
        try:
            info = self._session.load(
                config.model_path,
                n_ctx=config.n_ctx,
                kv_mode=config.kv_mode,
                n_threads=config.n_threads or None,
                flash_attn=config.flash_attn,
                n_gpu_layers=config.n_gpu_layers,
            )
        except Exception as err:  # every failure must reach the view, or it waits forever
            self.load_failed.emit(_message(err))
        else:
            self.model_loaded.emit(info)
            self._emit_status()

    @Slot(object, object, object)
    def send(self, messages: list[dict[str, str]], sampling: SamplingSettings, options: ReplyOptions) -> None:
        """Stream a reply to ``messages``: ``token`` per piece, then ``reply_finished`` or ``failed``."""
        last_status = 0.0
        try:
            stream = self._session.stream_reply(
                messages, sampling, self._cancel, max_tokens=options.max_tokens,
                context_full=options.context_full,
            )
            while True:
                try:
                    piece = next(stream)
                except StopIteration as end:
                    result: ReplyResult = end.value
                    break
                self.token.emit(piece)
                now = time.monotonic()
                if now - last_status >= STATUS_INTERVAL_S:
                    last_status = now
                    self._emit_status()
        except Exception as err:  # as in load_model
            self.failed.emit(_message(err))
        else:
            self.reply_finished.emit(result)
        finally:
            self._cancel.clear()
            self._emit_status()

    @Slot()
    def convert_now(self) -> None:
        """Compact a lazy cache now (idle-time conversion); progress arrives through ``conversion``."""
        try:
            converted = self._session.convert_kv_now()
        except Exception as err:
            self.failed.emit(_message(err))
            return
        self.converted.emit(converted)
        self._emit_status()

    @Slot(object)
    def set_crypto(self, crypto: Crypto | None) -> None:
        """How snapshots are protected from now on; None stops saving them (transcripts are saved apart)."""
        self._crypto = crypto
        if self._persistence is not None and crypto is not None:
            self._persistence.crypto = crypto

    @Slot(int, object)
    def save_snapshot(self, conv_id: int, budget_bytes: int) -> None:
        """After a completed reply: the conversation's KV cache into its snapshot file."""
        try:
            persistence = self._persistence_or_none()
            if persistence is None:
                return
            result = persistence.save(conv_id, budget_bytes)
        except (SnapshotError, StoreError, EngineError, OSError, KeyError) as err:
            self.snapshot_failed.emit(conv_id, _message(err))
        else:
            self.snapshot_saved.emit(conv_id, result)

    @Slot(int, object)
    def open_conversation(self, conv_id: int, messages: list[dict[str, str]]) -> None:
        """Restore the conversation's snapshot, or re-read its transcript with progress."""
        try:
            persistence = self._persistence_or_none(any_crypto=True)
            assert persistence is not None
            result = persistence.open(conv_id, messages, self.rebuild_progress.emit)
        except Exception as err:  # as in load_model: the view must hear back
            self.open_failed.emit(conv_id, _message(err))
        else:
            self.conversation_opened.emit(conv_id, result)
        finally:
            self._emit_status()

    @Slot()
    def refresh_status(self) -> None:
        self._emit_status()

    @Slot()
    def shutdown(self) -> None:
        """Free the model and the database connection, then end the worker's thread's event loop."""
        self._session.close()
        if self._persistence is not None:
            self._persistence.store.close()
        QThread.currentThread().quit()

    def _persistence_or_none(self, any_crypto: bool = False) -> Persistence | None:
        """The persistence of this thread (its own database connection), made on first use."""
        if self._crypto is None and not any_crypto:
            return None
        if self._persistence is None:
            store = Store()
            self._persistence = Persistence(
                store, self._session, self._crypto or Crypto("none"), data_dir() / "fingerprints.json"
            )
        if self._crypto is not None:
            self._persistence.crypto = self._crypto
        return self._persistence

    def _emit_status(self) -> None:
        try:
            self.kv_status.emit(self._session.kv_status())
        except EngineError:
            pass  # no model loaded: nothing to show

    def _on_conversion(self, event: ConversionEvent) -> None:
        self.conversion.emit(event)
        if event.stage == "end":
            self._emit_status()


def _message(err: Exception) -> str:
    """EngineError messages are written for the user; anything else is an engine bug, shown as such."""
    if isinstance(err, EngineError | SnapshotError | StoreError):
        return str(err)
    if isinstance(err, MemoryError):
        return "out of memory: close other programs, or choose a smaller context or the q8_0/lazy KV cache"
    return f"unexpected engine error: {type(err).__name__}: {err}"
