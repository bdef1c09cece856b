"""The Models page on the fake engine, the fake Hub and a fake home: search, download with progress and
Cancel, the fit the planner gives, an unknown starter id, and the downloaded model loading in the window."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from lazykv.core.kinds import KvMode
from lazykv.core.models.fit import fit_report
from lazykv.core.models.hub import Hub, read_header, repo_models
from lazykv.core.models.scan import Places
from lazykv.core.settings import Settings, load_spec
from lazykv.qt.main_window import MainWindow
from lazykv.qt.models_dialog import DISK_FIT, DISK_FOUND, HUB_FIT, ModelsDialog
from lazykv.qt.stall_meter import StallMeter
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, settle
from tests.support.fake_hub import FakeHub
from tests.support.model_library import FakeHome

DOWNLOAD_MS = 60_000  # a spawned worker process on a busy machine
FIT_WORDS = {"fits", "tight", "does not fit"}


def _dialog(qtbot: QtBot, w: MainWindow, places: Places, hub_env: dict[str, str]) -> ModelsDialog:
    d = ModelsDialog(w.settings, w, places=places, hub=Hub.from_env(hub_env))
    qtbot.addWidget(d)
    d.model_chosen.connect(w.loading.open_model)
    d.show()
    qtbot.waitUntil(lambda: _settled(d), timeout=10_000)
    return d


def _settled(d: ModelsDialog) -> bool:
    """Scanned, and every fit cell shows its plan (or why there is none)."""
    cells = [_cell(d, "disk_table", r, DISK_FIT) for r in range(d.disk_table.rowCount())]
    cells += [_cell(d, "hub_table", r, HUB_FIT) for r in range(d.hub_table.rowCount())]
    return d.rescan_button.isEnabled() and all(c in FIT_WORDS or c.startswith(("not offered", "unknown"))
                                               for c in cells)


def _cell(d: ModelsDialog, table: str, row: int, column: int) -> str:
    return getattr(d, table).item(row, column).text()


def _hub_row(d: ModelsDialog, name: str) -> int:
    return next(r for r in range(d.hub_table.rowCount()) if _cell(d, "hub_table", r, 0) == name)


@pytest.mark.slow
def test_search_download_and_the_model_loads(qtbot: QtBot, fake_window: FakeWindow, hub_env: dict[str, str],
                                             fake_hub: FakeHub, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """File > Models… (Ctrl+M) in the window: search, download, Load: the window loads it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the page scans this home's tool folders
    w = fake_window()
    assert w.models_action.shortcut().toString() == "Ctrl+M"
    assert w.models_action in w.menuBar().actions()[0].menu().actions()  # in the File menu
    w.models_action.trigger()
    d = w.findChild(ModelsDialog)
    assert d is not None and d.isVisible()
    qtbot.waitUntil(lambda: _settled(d), timeout=10_000)
    assert d.disk_table.rowCount() == 0 and "No GGUF models on disk yet" in d.disk_note.text()
    d.tabs.setCurrentIndex(1)
    meter = StallMeter()  # searching, listing, planning, downloading: none of it on the GUI thread
    meter.start()
    d.search_edit.setText("tiny")
    qtbot.keyClick(d.search_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: d.repo_list.count() == 1 and "acme/Tiny-GGUF" in d.repo_list.item(0).text())
    d.repo_list.setCurrentRow(0)
    qtbot.waitUntil(lambda: d.hub_table.rowCount() == 3 and _settled(d), timeout=10_000)
    assert "not offered: a projector" in _cell(d, "hub_table", _hub_row(d, "mmproj-tiny-f16.gguf"), HUB_FIT)
    # the fit shown is the planner's, from the header read over the network
    hub = Hub.from_env(hub_env)
    model = next(m for m in repo_models("acme/Tiny-GGUF", hub) if m.name == "tiny-Q8_0.gguf")
    spec = load_spec(w.settings, model.name, n_ctx=d.ctx_box.value(), kv_mode=str(d.kv_box.currentData()))
    report = fit_report(read_header(model, hub), spec)
    row = _hub_row(d, "tiny-Q8_0.gguf")
    assert _cell(d, "hub_table", row, HUB_FIT) == report.word
    longest = [_cell(d, "hub_table", row, HUB_FIT + 1 + i) for i in range(4)]
    assert longest == [f"{n:,}" for n in report.max_ctx.values()]
    d.hub_table.sortItems(HUB_FIT)  # sortable by fit: the projector (not offered) sorts last
    assert _cell(d, "hub_table", 2, 0) == "mmproj-tiny-f16.gguf"
    assert d.select_hub_file("tiny-Q8_0.gguf")
    assert not d.load_button.isEnabled()
    qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: d.downloaded is not None, timeout=DOWNLOAD_MS)
    assert d.downloaded.read_bytes() == fake_hub.repos["acme/Tiny-GGUF"].files["tiny-Q8_0.gguf"]
    assert d.progress.value() == 1000 and "checked (sha256)" in d.progress_label.text()
    qtbot.waitUntil(lambda: d.disk_table.rowCount() == 1 and _settled(d))  # rescanned: it is on disk now
    meter.stop()
    assert meter.max_cpu_gap_ms < 50, f"longest GUI-thread work between ticks {meter.max_cpu_gap_ms:.0f} ms"
    assert d.load_button.isEnabled()
    with qtbot.waitSignal(w.model_loaded, timeout=10_000) as loaded:
        qtbot.mouseClick(d.load_button, Qt.MouseButton.LeftButton)
    assert Path(loaded.args[0].path) == d.downloaded
    assert not d.isVisible()
    w.models_action.trigger()  # the same page again, its download done
    assert w.findChildren(ModelsDialog) == [d] and d.isVisible()


def test_the_demo_model_says_it_is_a_demo_and_points_to_the_models_page(
        qtbot: QtBot, fake: FakeSession, fake_model: Path, tiny_gguf: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = Settings()
    settings.set("snapshot_encryption", "none")
    w = MainWindow(settings, default_model=fake_model, session=fake)  # type: ignore[arg-type]
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS):
        w.open_configured_model()  # no model chosen yet: the demo
    assert w.demo_notice.isVisible() and "small demo model" in w.demo_notice.label.text()
    models = next(b for b in w.demo_notice.findChildren(QPushButton) if b.text() == "Models…")
    qtbot.mouseClick(models, Qt.MouseButton.LeftButton)
    d = w.findChild(ModelsDialog)
    assert d is not None and d.isVisible()
    d.close()
    with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS):
        w.loading.open_model(tiny_gguf)  # a real model: the note goes
    assert not w.demo_notice.isVisible()
    settle(qtbot, w)
    w.close()


def test_cancel_stops_a_download_and_says_it_resumes(qtbot: QtBot, fake_window: FakeWindow,
                                                     hub_env: dict[str, str], fake_hub: FakeHub,
                                                     tmp_path: Path) -> None:
    w = fake_window()
    d = _dialog(qtbot, w, Places(tmp_path / "home", dict(hub_env)), hub_env)
    fake_hub.hold_after["big-Q8_0.gguf"] = 10 * 1024 * 1024 + 1
    d.tabs.setCurrentIndex(1)
    d.search_edit.setText("big")
    d.search()
    qtbot.waitUntil(lambda: d.repo_list.count() == 1)
    d.repo_list.setCurrentRow(0)
    qtbot.waitUntil(lambda: d.hub_table.rowCount() == 1)
    d.hub_table.selectRow(0)
    qtbot.mouseClick(d.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: " of " in d.progress_label.text() and d.progress.value() > 0, timeout=DOWNLOAD_MS)
    assert d.cancel_button.isEnabled() and not d.download_button.isEnabled()
    qtbot.mouseClick(d.cancel_button, Qt.MouseButton.LeftButton)
    assert d.download is not None and d.download.state == "cancelled"
    assert "goes on where it stopped" in d.progress_label.text()
    assert d.download_button.isEnabled() and not d.cancel_button.isEnabled() and d.downloaded is None


def test_an_unknown_starter_id_says_not_found(qtbot: QtBot, fake_window: FakeWindow, hub_env: dict[str, str],
                                              tmp_path: Path) -> None:
    w = fake_window()
    d = _dialog(qtbot, w, Places(tmp_path / "home", dict(hub_env)), hub_env)
    assert d.repo_list.count() >= 10  # the starter list, before any search
    d.repo_list.setCurrentRow(0)  # the fake Hub knows none of them
    qtbot.waitUntil(lambda: d.repo_note.text().startswith("not found"))
    assert d.hub_table.rowCount() == 0


def test_the_disk_list_shows_every_tool_s_models_and_loads_one(qtbot: QtBot, fake_window: FakeWindow,
                                                               fake_home: FakeHome,
                                                               hub_env: dict[str, str]) -> None:
    w = fake_window()
    d = _dialog(qtbot, w, fake_home.places, hub_env)
    rows = {_cell(d, "disk_table", r, DISK_FOUND): r for r in range(d.disk_table.rowCount())}
    assert "Ollama: tiny:latest" in rows and "Hugging Face cache: acme/Tiny-GGUF/tiny-Q8_0.gguf" in rows
    fits = [_cell(d, "disk_table", r, DISK_FIT) for r in rows.values()]
    assert any(f.startswith("not offered: a projector") for f in fits)
    row = rows["Ollama: tiny:latest"]
    assert [_cell(d, "disk_table", row, c) for c in range(7)] == [
        "tiny:latest", "llama", "F16", "3M", "5.5 MiB", "4,096", "no"]  # Ollama's name: its blob is a hash
    assert _cell(d, "disk_table", row, DISK_FIT) in FIT_WORDS
    with qtbot.waitSignal(d.planned, timeout=10_000):  # planned off the GUI thread
        d.ctx_box.setValue(131072)  # the fit follows the context chosen: the tiny model's 4,096 at most
    assert _cell(d, "disk_table", rows["Ollama: tiny:latest"], DISK_FIT + 1) == "4,096"
    # each Longest cell's tooltip: the mode's tokens per GiB and quality, as Settings and estimate say them
    lazy = d.disk_table.item(rows["Ollama: tiny:latest"], DISK_FIT + 1 + list(KvMode).index(KvMode.LAZY))
    assert re.fullmatch(rf"lazy q8_0 \(f16 until half full\): [1-9][0-9,]* tokens per GiB · "
                        rf"{re.escape(KvMode.LAZY.quality)}", lazy.toolTip())
    d.kv_box.setCurrentIndex(d.kv_box.findData(str(KvMode.F16)))
    assert d.select_path(fake_home.files["ollama"])
    with qtbot.waitSignal(w.model_loaded, timeout=10_000) as loaded:
        qtbot.mouseClick(d.load_button, Qt.MouseButton.LeftButton)
    assert Path(loaded.args[0].path) == fake_home.files["ollama"]



def test_a_gated_repo_s_fit_is_unknown_and_says_why(qtbot: QtBot, fake_window: FakeWindow,
                                                    hub_env: dict[str, str], tmp_path: Path) -> None:
    w = fake_window()
    d = _dialog(qtbot, w, Places(tmp_path / "home", dict(hub_env)), hub_env)
    d.search_edit.setText("gated")
    d.search()
    qtbot.waitUntil(lambda: d.repo_list.count() == 1)
    assert "gated" in d.repo_list.item(0).text()
    d.repo_list.setCurrentRow(0)
    qtbot.waitUntil(lambda: d.hub_table.rowCount() == 1 and _settled(d), timeout=10_000)
    cell = d.hub_table.item(0, HUB_FIT)
    assert cell.text() == "unknown: its header could not be read"
    assert "accept its conditions" in cell.toolTip() and "HF_TOKEN" in cell.toolTip()
