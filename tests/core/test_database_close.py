"""Quitting never drops a write (issue 24.6): a write queued while ``Database.close`` runs is either
refused with the database's own error, or written before the connection closes; never lost between
the two (the executor shut down under a submit that had already passed the "closed?" check)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lazykv.core.history.records import StoreError, new_uid
from lazykv.core.history.store import Database

TURN = [{"role": "user", "content": "the last turn before quitting"}]


class ContendedLock:
    """A lock that says (``contended``) when a thread had to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.contended = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        self.contended.set()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


class GatedExecutor:
    """The database's executor, holding one thread's next submit at its door until ``go`` is set: then
    close() has either shut the executor down (the race is hit) or is waiting for the lock (no race)."""

    def __init__(self, real: ThreadPoolExecutor, go: threading.Event) -> None:
        self._real = real
        self.go = go
        self.gated: int | None = None  # the thread whose next submit waits
        self.at_the_door = threading.Event()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if threading.get_ident() == self.gated:
            self.gated = None
            self.at_the_door.set()
            assert self.go.wait(30), "close() neither shut the executor down nor waited for the lock"
        return self._real.submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        self._real.shutdown(wait)
        self.go.set()


def test_a_write_submitted_while_close_runs_is_written_or_refused_never_dropped(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    db.call(lambda s: s.clean_up())  # opened
    lock = ContendedLock()
    gate = GatedExecutor(db._executor, lock.contended)
    db._lock, db._executor = lock, gate  # type: ignore[assignment]

    def write() -> Future[Any]:
        gate.gated = threading.get_ident()
        return db.submit(lambda s: s.sync_transcript(new_uid(), TURN, 0, create=True))

    with ThreadPoolExecutor(1) as writer:
        queued = writer.submit(write)
        assert gate.at_the_door.wait(30)  # the write passed the "closed?" check and is being submitted
        closed = db.close(30)  # quit, in the window between that check and the submit
        future = queued.result(30)  # before the fix: RuntimeError, cannot schedule after shutdown
    assert closed and db.in_flight == 0
    try:
        synced = future.result(30)
    except StoreError:  # refused as closed: the caller knows it was not written
        return
    reopened = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    try:
        assert reopened.call(lambda s: s.conversation(synced.id).messages) == TURN
    finally:
        reopened.close(10)


def test_a_write_after_close_is_refused_with_the_databases_own_error(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.sqlite3", tmp_path / "snaps")
    assert db.close(10)
    refused = db.submit(lambda s: s.clean_up())
    assert isinstance(refused.exception(10), StoreError) and db.in_flight == 0
