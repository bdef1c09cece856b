"""The "Local server" switch: the local API (lazykv.server) served from the window's engine.

Each API request becomes a ``Borrow`` in the engine worker's queue, so it waits for the chat's
requests and they for it; the worker puts the chat's KV cache back after each one. The HTTP side runs
on its own thread (uvicorn); starting and stopping it happen off the GUI thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtWidgets import QLabel

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.memory import MiB
from lazykv.core.history.persistence import Crypto
from lazykv.core.paths import api_cache_dir
from lazykv.qt.worker import Borrow, EngineWorker, Failure, Request
from lazykv.server.app import create_app
from lazykv.server.engine_access import Generation, QueueFullError, RequestFailed, answer
from lazykv.server.prefix_cache import PrefixCache
from lazykv.server.service import HttpServer, open_cache
from lazykv.server.settings import ServerSettings

QUEUE_SIZE = 8
LOCAL_SERVER_SETTINGS = frozenset({"local_server", "local_server_port", "api_cache_mb"})


class WorkerAccess:
    """The routes' engine owner in the app: jobs go into the engine worker's queue as Borrow requests.
    ``submit`` is called on the server's event loop; the answers arrive on the GUI thread."""

    def __init__(self, worker: EngineWorker, settings: ServerSettings,
                 on_pending: Callable[[int], None]) -> None:
        self._worker = worker
        self.settings = settings
        self._on_pending = on_pending
        self._lock = threading.Lock()
        self._jobs: dict[int, Generation] = {}
        self._cache_key: tuple[Any, ...] | None = None
        self.cache: PrefixCache | None = None

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._jobs)

    def submit(self, job: Generation) -> None:
        request = Borrow(fn=lambda session, crypto: answer(session, self._cache(session, crypto), job))
        request.cancel = job.cancel  # a client gone stops it (or skips it, still queued)
        with self._lock:
            if len(self._jobs) >= self.settings.queue_size:
                raise QueueFullError(f"{len(self._jobs)} requests are running or waiting")
            self._jobs[request.id] = job
            pending = len(self._jobs)
        self._on_pending(pending)
        self._worker.submit(request)

    def answered(self, request: Request, failure: Failure | None) -> bool:
        """The worker answered ``request`` (GUI thread); False when it was none of ours. A job the worker
        never ran (cancelled while queued, or no model) still gets its end."""
        with self._lock:
            job = self._jobs.pop(request.id, None)
            pending = len(self._jobs)
        if job is None:
            return False
        if not job.ended:
            job.ended = True
            job.emit(RequestFailed(503, failure.message if failure else "The request was not run.",
                                   "server_error", "not_run"))
        self._on_pending(pending)
        return True

    def _cache(self, session: EngineSession, crypto: Crypto | None) -> PrefixCache | None:
        """The API cache for the model loaded now, under the snapshot protection in force (engine thread)."""
        info = session.model_info()
        key = (info.path, info.n_ctx, info.kv_mode, crypto.scheme if crypto else None, id(crypto))
        if key != self._cache_key:
            self.cache, self._cache_key = open_cache(self.settings, session, crypto), key
        return self.cache


class LocalServer(QObject):
    """On and off from the GUI thread; ``status`` carries the status bar's line ("" when off) and
    ``failed`` a sentence when the server could not start."""

    status = Signal(str)
    failed = Signal(str)
    _pending = Signal(int)  # from the server's thread

    def __init__(self, worker: EngineWorker, run_in_background: Callable[..., None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._worker = worker
        self._background = run_in_background
        self._http: HttpServer | None = None
        self._access: WorkerAccess | None = None
        self._api: Any = None
        self._waiting = 0
        self.config: tuple[int, int] | None = None  # (port, API cache MiB) it was started with
        worker.finished.connect(self._finished)
        worker.failed.connect(self._failed)
        self._pending.connect(self._show_pending)

    @property
    def running(self) -> bool:
        return self._http is not None

    @property
    def base_url(self) -> str:
        return self._http.base_url if self._http is not None else ""

    def start(self, port: int, budget_mb: int, model_name: str) -> None:
        """Serve on 127.0.0.1:``port`` (in the background; ``status`` says when it listens)."""
        if self._http is not None:
            return
        settings = ServerSettings(port=port, queue_size=QUEUE_SIZE, cache_dir=api_cache_dir(),
                                  cache_budget_bytes=budget_mb * MiB)
        access = WorkerAccess(self._worker, settings, self._pending.emit)
        app = create_app(settings, access, model_name, int(time.time()))
        http = HttpServer(settings, app, log_level="warning")
        self._http, self._access, self._api = http, access, app.state.api
        self.config = (port, budget_mb)

        def refused(err: Exception) -> None:
            if self._http is http:
                self._http = self._access = self._api = self.config = None
            self.status.emit("")
            self.failed.emit(f"The local server could not listen on 127.0.0.1:{port}: {err}")

        self._background(http.start, lambda _url: self._show_pending(self._waiting), refused,
                         "Starting the local server")

    def stop(self, wait: bool = False) -> None:
        """Stop serving (in the background, or now when ``wait``: at exit)."""
        http, self._http, self._access, self._api = self._http, None, None, None
        self.config = None
        self.status.emit("")
        if http is None:
            return
        if wait:
            http.stop(2.0)
        else:
            self._background(http.stop, None, None, "Stopping the local server")

    def set_model_name(self, name: str) -> None:
        if self._api is not None:
            self._api.model_name = name

    @Slot(object, object)
    def _finished(self, request: Request, _result: object) -> None:
        if self._access is not None:
            self._access.answered(request, None)

    @Slot(object, object)
    def _failed(self, request: Request, failure: Failure) -> None:
        if self._access is not None:
            self._access.answered(request, failure)

    @Slot(int)
    def _show_pending(self, waiting: int) -> None:
        self._waiting = waiting
        if self._http is None:
            return
        line = f"Local API {self._http.base_url}"
        if waiting:
            line += f" · {waiting} request{'s' if waiting != 1 else ''}"
        self.status.emit(line)


class LocalServerSwitch(QObject):
    """The window's side: the Settings switch, the status bar's line, errors in the window's way."""

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self._window = window
        self.server = LocalServer(window.worker, window.background.run, self)
        self.label = QLabel()
        self.label.setObjectName("local-server-status")
        self.label.setToolTip("The local server answers OpenAI-compatible requests from this machine; "
                              "they wait for the chat's (Settings > Local API).")
        self.label.hide()
        window.statusBar().addPermanentWidget(self.label)
        self.server.status.connect(self._show)
        self.server.failed.connect(lambda message: window.show_error("Local server", message))
        window.model_loaded.connect(lambda _info: self.sync())

    def sync(self) -> None:
        """Serve when the switch is on and a model is loaded; restart on a new port or budget."""
        window, server = self._window, self.server
        if not window.setting("local_server") or window.model_info is None:
            server.stop()
            return
        config = (window.setting("local_server_port"), window.setting("api_cache_mb"))
        if server.running and server.config != config:
            server.stop()
        if not server.running:
            server.start(*config, window.model_info.name)
        server.set_model_name(window.model_info.name)

    def stop(self, wait: bool = False) -> None:
        self.server.stop(wait)

    @Slot(str)
    def _show(self, line: str) -> None:
        self.label.setText(line)
        self.label.setVisible(bool(line))
