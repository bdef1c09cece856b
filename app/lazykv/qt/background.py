"""Short blocking jobs (disk reads and writes) off the GUI thread, answered on the GUI thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

if TYPE_CHECKING:
    from lazykv.qt.operations import Operations


class _Carrier(QObject):
    done = Signal(object)
    failed = Signal(object)


class _Job(QRunnable):
    def __init__(self, fn: Callable[[], Any], carrier: _Carrier) -> None:
        super().__init__()
        self._fn, self._carrier = fn, carrier

    def run(self) -> None:
        try:
            result = self._fn()
        except Exception as err:  # handed to on_error on the GUI thread
            self._carrier.failed.emit(err)
        else:
            self._carrier.done.emit(result)


class Background(QObject):
    """``run(fn, on_done, on_error)``: fn runs on a pool thread; the callbacks run on this object's thread.

    A job without ``on_error`` reports its error through ``unhandled(what, error)``: none is dropped.
    Each job counts in ``ops`` (when given) from ``run`` until its callback has run.
    """

    unhandled = Signal(str, object)  # what failed (the job's label), the exception

    def __init__(self, parent: QObject | None = None, ops: Operations | None = None) -> None:
        super().__init__(parent)
        self._ops = ops
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)  # in order: a later settings save never overtakes an earlier one
        self._pool.setExpiryTimeout(-1)  # always the same thread: a database connection lives on it
        self._carriers: set[_Carrier] = set()

    def run(
        self,
        fn: Callable[[], Any],
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        what: str = "A background job",
    ) -> None:
        op = self._ops.begin(what) if self._ops is not None else None
        # lives on this thread, so its signals arrive here, queued; a child of this object, so
        # answers still queued when the owner (e.g. a closed window) is deleted are dropped with it
        carrier = _Carrier(self)
        self._carriers.add(carrier)

        def settle() -> None:
            self._carriers.discard(carrier)
            carrier.deleteLater()
            if op is not None and self._ops is not None:
                self._ops.end(op)

        @Slot(object)
        def finished(result: Any) -> None:
            settle()
            if on_done is not None:
                on_done(result)

        @Slot(object)
        def errored(err: Exception) -> None:
            settle()
            if on_error is not None:
                on_error(err)
            else:
                self.unhandled.emit(what, err)

        carrier.done.connect(finished)
        carrier.failed.connect(errored)
        self._pool.start(_Job(fn, carrier))

    def wait(self, msecs: int = 10_000) -> bool:
        """Wait for queued jobs (at exit, so a last settings save is not lost)."""
        return self._pool.waitForDone(msecs)
