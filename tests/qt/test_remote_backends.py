"""Remote backends in the app (fake engine): the settings editor, the banner for servers left out, the
memory panel's split into device and host memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel, QPlainTextEdit
from pytestqt.qtbot import QtBot

from lazykv.core.engine.memory import DeviceMemory, MiB
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.planner import HOST_CPU
from lazykv.core.engine.remote import RPC_PROTO_VERSION
from lazykv.core.engine.types import KvStatus, ModelInfo
from lazykv.core.kinds import KvMode, KvPhase
from lazykv.core.settings import REMOTE_GROUP, Settings
from lazykv.qt.memory_panel import MemoryPanel
from lazykv.qt.settings_dialog import SettingsDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, settle
from tests.support.rpc_server import fake_rpc_server, free_port, hello_reply

RPC = "RPC0"
RPC_PLACE = "device memory (RPC0, 127.0.0.1:50052)"


@pytest.fixture
def closed_port() -> str:
    return f"127.0.0.1:{free_port()}"


def _servers_edit(dialog: SettingsDialog) -> QPlainTextEdit:
    edit = dialog.editors["rpc_servers"]
    assert isinstance(edit, QPlainTextEdit)
    return edit


def test_the_editor_explains_validates_and_removes_duplicates(qtbot: QtBot, fake_model: Path) -> None:
    dialog = SettingsDialog(Settings(), read_model_meta(fake_model))
    qtbot.addWidget(dialog)
    dialog.show()
    group = dialog.editors["rpc_servers"].parentWidget()
    assert group is not None and group.title() == REMOTE_GROUP
    hint = dialog.findChild(QLabel, "rpc_servers-hint")
    assert hint is not None and hint.isVisible()  # the explanation
    assert "ggml-rpc-server" in hint.text() and "offload" in hint.text()
    assert dialog.editors["rpc_layers"].specialValueText() == "0 = all layers"

    _servers_edit(dialog).setPlainText("gpu-box:50052\nGPU-box:50052, 10.0.0.7:1\nbox:99999")
    problems = dialog.findChild(QLabel, "rpc_servers-problems")
    assert problems is not None and problems.isVisible()
    assert "box:99999" in problems.text() and "1 to 65535" in problems.text()
    assert not dialog.ok_button.isEnabled()  # nothing typed is lost: the text stays, OK waits

    _servers_edit(dialog).setPlainText("gpu-box:50052\nGPU-box:50052, 10.0.0.7:1")
    assert not problems.isVisible() and dialog.ok_button.isEnabled()
    assert dialog.changed() == {"rpc_servers": ["gpu-box:50052", "10.0.0.7:1"]}
    assert "device memory (remote: gpu-box:50052, 10.0.0.7:1)" in dialog.estimate_label.text()
    assert dialog.reload_note.isVisible()


def test_an_unreachable_server_is_left_out_said_and_the_chat_goes_on(
    qtbot: QtBot, fake_window: FakeWindow, fake: FakeSession, closed_port: str
) -> None:
    w = fake_window(rpc_servers=[closed_port])
    assert w.model_info is not None and w.model_info.remote == ()
    assert w.remote_notice.isVisible()
    text = w.remote_notice.label.text()
    assert closed_port in text and "connection refused" in text and "runs without it" in text
    assert not w.remote_notice.details.isVisible()
    w.remote_notice.details_button.click()
    assert "ggml-rpc-server" in w.remote_notice.details.text() and w.remote_notice.details.isVisible()
    assert chat(qtbot, w, "Still there?").text == "Fake reply text."

    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS):  # the list changed: the engine reloads
        w.apply_settings({"rpc_servers": []})
    settle(qtbot, w)
    assert fake.calls.count("load") == 2 and not w.remote_notice.isVisible()


def test_an_answering_server_is_used_and_no_banner_shows(qtbot: QtBot, fake_window: FakeWindow) -> None:
    with fake_rpc_server(hello_reply(*RPC_PROTO_VERSION, 0)) as endpoint:
        w = fake_window(rpc_servers=[endpoint])
    assert w.model_info is not None and w.model_info.remote == (endpoint,)
    assert not w.remote_notice.isVisible()
    assert w.setting("rpc_servers") == [endpoint]


def _info(fake_model: Path, memory: tuple[DeviceMemory, ...]) -> ModelInfo:
    meta = read_model_meta(fake_model)
    return ModelInfo(fake_model, "llama", 1000, 4096, 64 * MiB, 4096, KvMode.LAZY, 2, meta, memory=memory)


def test_the_panel_splits_weights_and_kv_by_place(qtbot: QtBot, fake_model: Path) -> None:
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    split = (DeviceMemory(RPC, False, 60 * MiB, 12 * MiB, MiB, "127.0.0.1:50052"),
             DeviceMemory("CPU", True, 4 * MiB, 0, MiB))
    panel.set_model(_info(fake_model, split))
    assert panel.weights_label.text() == f"60.0 MiB in {RPC_PLACE}, 4.0 MiB in {HOST_CPU} (fake)"
    status = KvStatus(KvMode.LAZY, KvPhase.F16, 100, 400, 800, 12 * MiB)
    panel.set_status(status)
    assert panel.kv_label.text() == f"3.0 MiB in use of 12.0 MiB: 12.0 MiB in {RPC_PLACE}"

    cpu_only = (DeviceMemory("CPU", True, 64 * MiB, 12 * MiB, MiB),)
    panel.set_model(_info(fake_model, cpu_only))
    panel.set_status(replace(status, n_cells_used=400))
    assert panel.kv_label.text() == f"12.0 MiB in use of 12.0 MiB: 12.0 MiB in {HOST_CPU}"
    assert panel.weights_label.text() == f"64.0 MiB in {HOST_CPU} (fake)"
