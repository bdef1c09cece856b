"""One running LazyKV Chat per user and data directory: starting it again brings the window forward.

The first process holds a lock file in the data directory (QLockFile: a crashed holder's
lock is taken over) and listens on a local socket named after that directory. A later
process finds the lock taken, asks the first one over the socket to show its window, and exits.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

LOCK_NAME = "lazykv.lock"
DIR_MODE = 0o700
RAISE = b"raise\n"
CONNECT_MS = 2000


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
        data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)  # private, as the history in it
        self._name = server_name(data_dir)
        self._lock = QLockFile(str(data_dir / LOCK_NAME))
        self._server: QLocalServer | None = None

    def claim(self) -> bool:
        if not self._lock.tryLock(0):
            self._ask_first_to_raise()
            return False
        QLocalServer.removeServer(self._name)  # a crashed holder's socket file
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._on_connection)
        self._server.listen(self._name)
        return True

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._lock.unlock()

    def _ask_first_to_raise(self) -> None:
        socket = QLocalSocket()
        socket.connectToServer(self._name)
        if socket.waitForConnected(CONNECT_MS):
            socket.write(RAISE)
            socket.waitForBytesWritten(CONNECT_MS)
            socket.disconnectFromServer()

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
