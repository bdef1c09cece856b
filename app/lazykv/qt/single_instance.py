"""One running LazyKV Chat per user and data directory: starting it again brings the window forward.

The first process holds a lock file in the data directory (QLockFile: a crashed holder's
lock is taken over) and listens on a local socket named after that directory. A later
process finds the lock taken, asks the first one over the socket to show its window, waits for
its answer (so that it can say whether the first one really came forward), and exits.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from lazykv.core.paths import private_dir, restrict

LOCK_NAME = "lazykv.lock"
RAISE = b"raise\n"
RAISED = b"raised\n"
CONNECT_MS = 2000
ANSWER_S = 10.0  # the first process may be busy starting (loading a model) before its event loop runs


def server_name(data_dir: Path) -> str:
    """The local socket's name for this user and data directory (short: socket paths are limited)."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode("utf-8")).hexdigest()[:16]
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "user"
    return f"lazykv-{user}-{digest}"


class SingleInstance(QObject):
    """``claim()``: True in the first process (then ``activated`` fires on each later start), False
    in a later one, after asking the first to come forward."""

    activated = Signal()

    def __init__(self, data_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        private_dir(data_dir, own=True)  # private, as the history in it
        self._name = server_name(data_dir)
        self._lock_path = data_dir / LOCK_NAME
        self._lock = QLockFile(str(self._lock_path))
        self._server: QLocalServer | None = None
        self.answered = False  # in a later process: whether the first one said it came forward
        self.listen_error = ""  # in the first process: why later starts cannot reach it ("" when they can)

    def claim(self) -> bool:
        if not self._lock.tryLock(0):
            self.answered = self._ask_first_to_raise()
            return False
        restrict(self._lock_path)  # Qt makes it with the umask's mode
        QLocalServer.removeServer(self._name)  # a crashed holder's socket file
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._on_connection)
        if not self._server.listen(self._name):
            self.listen_error = self._server.errorString()
        return True

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._lock.unlock()

    def _ask_first_to_raise(self) -> bool:
        """Ask the first process to come forward; True once it answered that it did."""
        deadline = time.monotonic() + ANSWER_S
        socket = QLocalSocket()
        socket.connectToServer(self._name)
        while not socket.waitForConnected(CONNECT_MS):  # it may hold the lock a moment before it listens
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
            socket.connectToServer(self._name)
        socket.write(RAISE)
        socket.waitForBytesWritten(CONNECT_MS)
        answer = b""
        while not answer.endswith(b"\n") and time.monotonic() < deadline:
            if socket.waitForReadyRead(CONNECT_MS):
                answer += bytes(socket.readAll().data())
        socket.disconnectFromServer()
        return answer == RAISED

    def _on_connection(self) -> None:
        assert self._server is not None
        while (socket := self._server.nextPendingConnection()) is not None:
            socket.readyRead.connect(lambda s=socket: self._on_message(s))
            socket.disconnected.connect(socket.deleteLater)
            if socket.bytesAvailable():
                self._on_message(socket)

    def _on_message(self, socket: QLocalSocket) -> None:
        if bytes(socket.readAll().data()).startswith(RAISE.strip()):
            self.activated.emit()
            socket.write(RAISED)
            socket.flush()
