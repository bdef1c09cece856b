"""A loaded engine session served over HTTP: the routes, the engine's thread, the API cache and uvicorn,
put together. ``run()`` in the foreground (``python -m lazykv serve``), ``start()`` on a thread of its
own (tests, the benchmark)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.fingerprint import model_sha256
from lazykv.core.history.persistence import Crypto
from lazykv.core.paths import fingerprints_file
from lazykv.server.app import create_app
from lazykv.server.engine_access import EngineAccess
from lazykv.server.prefix_cache import Binding, PrefixCache
from lazykv.server.settings import ServerSettings

log = logging.getLogger(__name__)


def open_cache(settings: ServerSettings, session: EngineSession, crypto: Crypto | None) -> PrefixCache | None:
    """The API cache for the loaded model and its settings (None without a cache folder or a crypto)."""
    if settings.cache_dir is None or crypto is None:
        return None
    info = session.model_info()
    layout = session.layout()
    binding = Binding(model_sha256=model_sha256(info.path, fingerprints_file()),
                      n_ctx=info.n_ctx, kv_mode=str(info.kv_mode),
                      engine_version=layout.engine_version)
    return PrefixCache(settings.cache_dir, binding, crypto, settings.cache_budget_bytes,
                       settings.cache_min_tokens)


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM or Ctrl+C it handled is not raised again once it stopped: uvicorn
    re-raises it, and the default SIGTERM handler then ended the process before the engine's thread could
    finish the snapshot it was writing after the last reply (``Service.run`` waits for it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


class HttpServer:
    """uvicorn serving ``app`` as ``settings`` say: in the foreground, or on a thread of its own."""

    def __init__(self, settings: ServerSettings, app: ASGIApp, log_level: str = "info") -> None:
        self.settings = settings
        self._config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                      lifespan="off", access_log=log_level == "debug",
                                      timeout_graceful_shutdown=5)
        self._server = _Server(self._config)
        self._thread: threading.Thread | None = None
        self.port = settings.port

    def run(self) -> None:
        """Serve until Ctrl+C / SIGTERM; OSError when the address cannot be bound."""
        self._server.run(sockets=[self._bind()])

    def _bind(self) -> socket.socket:
        """The listening socket (uvicorn's own bind exits the process when the port is taken)."""
        host = self.settings.host
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), self.settings.port))
        except OSError:
            sock.close()
            raise
        return sock

    def start(self, timeout: float = 30.0) -> str:
        """Serve on a thread of its own; returns the base URL (``.../v1``) once it accepts connections.
        OSError when the address cannot be bound (e.g. the port is taken)."""
        sock = self._bind()
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="lazykv-api-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self.base_url

    @property
    def base_url(self) -> str:
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


class Service:
    """The headless server: a loaded session on the API's own engine thread, behind an HttpServer."""

    def __init__(self, settings: ServerSettings, session: EngineSession, crypto: Crypto | None,
                 log_level: str = "info") -> None:
        self.settings = settings
        info = session.model_info()
        self.cache = open_cache(settings, session, crypto)
        self.access = EngineAccess(session, self.cache, settings.queue_size)
        self.app = create_app(settings, self.access, info.name, int(time.time()))
        self.http = HttpServer(settings, self.app, log_level)

    def run(self, stop_timeout: float = 120.0) -> None:
        """Serve until Ctrl+C / SIGTERM, then cancel what waits and let the engine's thread finish what it
        runs: a reply already answered finishes its snapshot (every file of it complete, then the index),
        within ``stop_timeout`` seconds; past that the process may end inside it, and what it left is
        never counted (unfinished files are removed at the next start)."""
        try:
            self.http.run()
        finally:
            if not self.access.close(stop_timeout):
                log.warning("the engine did not stop within %g s; its last snapshot may be lost",
                            stop_timeout)

    def start(self, timeout: float = 30.0) -> str:
        return self.http.start(timeout)

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def base_url(self) -> str:
        return self.http.base_url

    def stop(self, timeout: float = 30.0) -> None:
        self.http.stop(timeout)
        self.access.close(timeout)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for a server started later, e.g. in another process)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
