"""Operations in flight, and the GUI's side of the engine worker (Anki's background ops, napari's workers).

``Operations`` counts what runs off the GUI thread (engine requests, disk jobs): the window
disables actions that would conflict while it is non-zero, tests wait for zero, and shutdown
says what it waits for. ``EngineClient`` sends a request with its callbacks and routes the
answer to them by the request's identity, on the GUI thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from lazykv.qt.worker import EngineWorker, Failure, Request


class Operations(QObject):
    """The operations in flight, by label; ``changed`` carries the new count."""

    changed = Signal(int)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._running: dict[int, str] = {}

    def begin(self, label: str) -> int:
        key = next(self._ids)
        self._running[key] = label
        self.changed.emit(len(self._running))
        return key

    def end(self, key: int) -> None:
        if self._running.pop(key, None) is not None:
            self.changed.emit(len(self._running))

    @property
    def count(self) -> int:
        return len(self._running)

    def labels(self) -> list[str]:
        return list(self._running.values())


@dataclass
class _Pending:
    request: Request
    on_done: Callable[[Any], None] | None
    on_failed: Callable[[Failure], None] | None
    on_progress: Callable[[Any], None] | None
    op: int = 0


class EngineClient(QObject):
    """Sends requests to the worker; each answer goes to the callbacks given with its request.

    A failure without an ``on_failed`` goes to ``unhandled(request, failure)``, so none is lost;
    a cancelled request without one ends quietly.
    """

    unhandled = Signal(object, object)  # Request, Failure

    def __init__(self, worker: EngineWorker, ops: Operations, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._worker = worker
        self._ops = ops
        self._pending: dict[int, _Pending] = {}
        self._closed = False
        worker.finished.connect(self._finished)
        worker.failed.connect(self._failed)
        worker.progress.connect(self._progress)

    def submit(
        self,
        request: Request,
        on_done: Callable[[Any], None] | None = None,
        on_failed: Callable[[Failure], None] | None = None,
        on_progress: Callable[[Any], None] | None = None,
    ) -> Request:
        """Send ``request``; after ``close()`` (the app is exiting) it is dropped unsent and unanswered."""
        if self._closed:
            return request
        pending = self._pending[request.id] = _Pending(request, on_done, on_failed, on_progress)
        pending.op = self._ops.begin(request.what)  # after: a listener of the count sees it pending
        return self._worker.submit(request)

    def pending(self) -> list[Request]:
        return [p.request for p in self._pending.values()]

    def cancel_all(self) -> None:
        """Cancel every request sent and not yet answered (the running one stops, queued ones are skipped)."""
        for pending in self._pending.values():
            pending.request.cancel.set()

    def close(self) -> None:
        """At exit: cancel everything sent; answers still to come go nowhere; nothing more is sent."""
        self._closed = True
        self.cancel_all()
        for pending in self._pending.values():
            self._ops.end(pending.op)
        self._pending.clear()

    @Slot(object, object)
    def _progress(self, request: Request, payload: Any) -> None:
        pending = self._pending.get(request.id)
        if pending is not None and pending.on_progress is not None:
            pending.on_progress(payload)

    def _answered(self, request: Request) -> _Pending | None:
        """The request's pending entry, its operation ended (None: cancelled away or closed)."""
        pending = self._pending.pop(request.id, None)
        if pending is not None:
            self._ops.end(pending.op)  # after the pop: a listener of the count sees it answered
        return pending

    @Slot(object, object)
    def _finished(self, request: Request, result: Any) -> None:
        pending = self._answered(request)
        if pending is not None and pending.on_done is not None:
            pending.on_done(result)

    @Slot(object, object)
    def _failed(self, request: Request, failure: Failure) -> None:
        pending = self._answered(request)
        if pending is None:
            return
        if pending.on_failed is not None:
            pending.on_failed(failure)
        elif not failure.cancelled:
            self.unhandled.emit(request, failure)
