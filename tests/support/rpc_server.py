"""A local llama.cpp RPC server (``ggml-rpc-server``, shipped with the engine wheel) for tests."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import llama_cpp

from lazykv.core.engine.remote import RPC_CONN_CAPS_SIZE

START_TIMEOUT_S = 20.0


def free_port() -> int:
    """A port nothing listens on now (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


@contextmanager
def rpc_server(log: Path) -> Iterator[str]:
    """``ggml-rpc-server`` on 127.0.0.1 at a free port; yields its ``host:port`` once it accepts connections.

    Its output goes to ``log``. Stopped (terminated, then killed) on exit."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(llama_cpp.rpc_server_path()), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(proc, port, log)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ggml-rpc-server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"ggml-rpc-server did not listen on {port} within {START_TIMEOUT_S:g} s")


def hello_reply(major: int, minor: int, patch: int) -> bytes:
    """What a llama.cpp RPC server answers to HELLO: the reply's size, its version, padding, capabilities."""
    size = struct.pack("<Q", 4 + RPC_CONN_CAPS_SIZE)
    return size + bytes([major, minor, patch, 0]) + bytes(RPC_CONN_CAPS_SIZE)


@contextmanager
def fake_rpc_server(answer: bytes | None) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that reads each client's first bytes, then sends ``answer`` and closes
    (None: stays silent while the client waits; b"": closes at once). Yields its ``host:port``."""
    stop = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                if answer != b"":
                    conn.recv(64)
                if answer is None:
                    stop.wait(5)
                elif answer:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, name="fake-rpc-server", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        server.close()
