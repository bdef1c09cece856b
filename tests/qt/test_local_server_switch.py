"""The "Local server" switch on the fake engine: on and off, the status bar, a port that is taken."""

from __future__ import annotations

import socket

import httpx
from pytestqt.qtbot import QtBot

from lazykv.server.service import free_port
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import error_box


def test_the_switch_serves_the_loaded_model_and_stops(fake_window: FakeWindow, qtbot: QtBot) -> None:
    port = free_port()
    w = fake_window()
    label = w.local_server.label
    assert not label.isVisible() and not w.local_server.server.running  # off by default
    w.apply_settings({"local_server": True, "local_server_port": port})
    qtbot.waitUntil(label.isVisible, timeout=10_000)
    assert label.text() == f"Local API http://127.0.0.1:{port}/v1"
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [w.model_info.name]
    w.apply_settings({"local_server": False})
    qtbot.waitUntil(lambda: not label.isVisible())
    assert not w.local_server.server.running


def test_a_taken_port_is_said_and_the_window_goes_on(fake_window: FakeWindow, qtbot: QtBot) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        w = fake_window(local_server=True, local_server_port=port)
        qtbot.waitUntil(lambda: error_box(w) is not None, timeout=10_000)
    assert f"127.0.0.1:{port}" in error_box(w).text()
    assert not w.local_server.label.isVisible() and not w.local_server.server.running
    assert w.ops.count == 0
