"""Settings > Tools over a real hub and tests/support/mcp_server.py: the saved servers and their state,
enabling, adding, importing, stderr on demand, revoking a remembered permission."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from lazykv.core.paths import tool_permissions_file
from lazykv.core.settings import Settings
from lazykv.core.tools.consent import ConsentStore, Decision
from lazykv.core.tools.mcp_config import McpServerConfig, load_servers, save_servers
from lazykv.core.tools.mcp_hub import McpHub, ServerState
from lazykv.qt.settings_dialog import SettingsDialog
from lazykv.qt.tools_page import STATE_COLORS, ToolsPage

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"
TEST_SERVER = McpServerConfig("t", command=sys.executable, args=(str(SERVER),))
MISSING = McpServerConfig("gone", command="/nonexistent/lazykv-mcp")
WAIT_MS = 15_000


@pytest.fixture
def hub() -> Iterator[McpHub]:
    save_servers([TEST_SERVER, MISSING])
    h = McpHub(load_servers(), timeout_s=5, output_cap=65536)
    h.start()
    yield h
    h.close()


@pytest.fixture
def page(qtbot: QtBot, hub: McpHub) -> ToolsPage:
    consent = ConsentStore(tool_permissions_file())
    consent.record("t", "add", Decision.ALWAYS)
    p = ToolsPage(hub, consent)
    qtbot.addWidget(p)
    p.show()
    return p


def _row(page: ToolsPage, name: str):
    return next(page.tree.topLevelItem(i) for i in range(page.tree.topLevelItemCount())
                if page.tree.topLevelItem(i).text(0) == name)


def test_lists_the_saved_servers_and_their_state(qtbot: QtBot, page: ToolsPage) -> None:
    assert [page.tree.topLevelItem(i).text(0) for i in range(page.tree.topLevelItemCount())] == ["t", "gone"]
    qtbot.waitUntil(lambda: _row(page, "t").text(2) == "Ready", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: _row(page, "gone").text(2) == "Failed", timeout=WAIT_MS)
    assert _row(page, "t").foreground(2).color().name() == STATE_COLORS[ServerState.READY]
    assert _row(page, "gone").foreground(2).color().name() == STATE_COLORS[ServerState.FAILED]
    assert _row(page, "t").text(1) == "Command"
    page.tree.setCurrentItem(_row(page, "t"))
    assert [page.tools_list.item(i).text().split(" \u2014")[0] for i in range(page.tools_list.count())] == [
        "echo", "add", "hang", "flood", "fail"]
    page.tree.setCurrentItem(_row(page, "gone"))
    assert "not found" in page.detail.text() and page.tools_list.count() == 0
    assert page.stderr_button.isEnabled() and page.stderr_view.isHidden()
    page.stderr_button.click()
    assert page.stderr_view.isVisible() and page.stderr_view.toPlainText() == "(nothing on stderr)"


def test_unticking_disables_and_saves(qtbot: QtBot, page: ToolsPage, hub: McpHub) -> None:
    qtbot.waitUntil(lambda: _row(page, "t").text(2) == "Ready", timeout=WAIT_MS)
    _row(page, "t").setCheckState(0, Qt.CheckState.Unchecked)
    assert not load_servers()[0].enabled
    assert hub.status()["t"].state is ServerState.DISABLED and hub.tools() == []
    assert _row(page, "t").text(2) == "Disabled"


def test_add_a_url_server_and_a_bad_one(qtbot: QtBot, page: ToolsPage) -> None:
    page.add_button.click()
    dialog = page._dialog
    dialog.name.setText("t")
    dialog.command.setText("x")
    dialog.accept()
    assert dialog.isVisible() and "already a server named" in dialog.problem.text()
    dialog.name.setText("web")
    dialog.kind.setCurrentIndex(1)
    dialog.url.setText("http://127.0.0.1:9/mcp")
    dialog.accept()
    assert not dialog.isVisible()
    assert [s.name for s in load_servers()] == ["t", "gone", "web"]
    assert _row(page, "web").text(1) == "URL"


def test_import_merges_and_a_bad_file_is_a_sentence(qtbot: QtBot, page: ToolsPage, tmp_path: Path) -> None:
    good = tmp_path / "mcp.json"
    good.write_text(json.dumps({"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"],
                                                        "disabled": True}}}), encoding="utf-8")
    page.import_file(str(good))
    assert [s.name for s in load_servers()] == ["t", "gone", "time"]
    assert _row(page, "time").text(2) == "Disabled"
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    page.import_file(str(bad))
    assert "not valid JSON" in page.problem.text()


def test_revoke_a_remembered_permission(page: ToolsPage) -> None:
    assert page.permissions.count() == 1 and "add" in page.permissions.item(0).text()
    page.revoke_button.click()
    assert page.permissions.count() == 0 and not page.revoke_button.isEnabled()
    assert ConsentStore(tool_permissions_file()).remembered() == []


def test_settings_dialog_has_a_tools_tab_with_the_tool_settings(qtbot: QtBot, hub: McpHub) -> None:
    page = ToolsPage(hub, ConsentStore(None))  # the dialog owns it
    dialog = SettingsDialog(Settings(), tools_page=page)
    qtbot.addWidget(dialog)
    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == ["General", "Tools"]
    tools_tab = dialog.tabs.widget(1)
    assert tools_tab.isAncestorOf(page) and tools_tab.isAncestorOf(dialog.editors["tool_timeout_s"])
    assert tools_tab.isAncestorOf(dialog.editors["tool_output_kib"])
    dialog.set_value("tool_timeout_s", 5)
    assert dialog.changed() == {"tool_timeout_s": 5}
    plain = SettingsDialog(Settings())  # without a page: no tabs, the settings in the right column
    qtbot.addWidget(plain)
    assert not hasattr(plain, "tabs") and "tool_timeout_s" in plain.editors
