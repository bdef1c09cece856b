"""The window's actions come from their one declaration (lazykv.qt.actions): the menus, the toolbar, the
enabled state per UiState, Help > Keyboard shortcuts and the README's key list; Help > About."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QMenu, QToolBar
from pytestqt.qtbot import QtBot

from lazykv import __version__
from lazykv.core.engine import engine_check
from lazykv.core.engine.devices import gpu_build
from lazykv.core.kinds import FinishReason
from lazykv.qt import about_dialog, actions
from lazykv.qt.about_dialog import ASKING, AboutDialog
from lazykv.qt.main_window import MainWindow, UiState
from lazykv.qt.shortcuts_dialog import ShortcutsDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat, settle

README = Path(__file__).resolve().parents[2] / "README.md"

# the menus as they were before the declaration (plus Help > About): no entry lost, none moved
MENUS = {
    "File": ["New private chat", "-", "Models…", "Open model…", "Open recent", "Model information…",
             "-", "Settings…", "-", "Quit"],
    "Chat": ["New chat", "Stop generating", "Regenerate", "Continue the reply", "Edit last message",
             "Copy last reply", "Branch from the last message", "Rename conversation…", "Undo delete",
             "Search conversations",
             "Compact context memory now", "-", "Private chat (save nothing)"],
    "View": ["Conversations", "Memory"],
    "Help": ["Keyboard shortcuts", "About LazyKV Chat"],
}
# and their keys as Linux binds them
KEYS = {"New private chat": "Ctrl+Shift+N", "Models…": "Ctrl+M", "Open model…": "Ctrl+O",
        "Settings…": "Ctrl+,", "Quit": "Ctrl+Q", "New chat": "Ctrl+N", "Stop generating": "Esc",
        "Regenerate": "Ctrl+R", "Continue the reply": "Ctrl+Shift+R", "Edit last message": "Ctrl+E",
        "Copy last reply": "Ctrl+Shift+C", "Branch from the last message": "Ctrl+B",
        "Rename conversation…": "F2", "Undo delete": "Ctrl+Z",
        "Search conversations": "Ctrl+F", "Keyboard shortcuts": "Ctrl+/"}
TOOLBAR = ["New chat", "Regenerate", "Continue the reply", "Compact context memory now", "Settings…",
           "Memory"]


def entries(menu: QMenu) -> list[str]:
    return ["-" if a.isSeparator() else a.text().replace("&", "") for a in menu.actions()]


@pytest.fixture
def window(fake_window: FakeWindow) -> MainWindow:
    return fake_window()


def test_the_readme_key_list_is_the_declarations() -> None:
    assert actions.readme_block(README.read_text(encoding="utf-8")) == actions.markdown(), (
        "README.md's key list differs from app/lazykv/qt/actions.py: "
        "run `python -m lazykv.qt.actions --readme README.md`")


def test_the_script_prints_and_rewrites_the_key_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert actions.main(["--markdown"]) == 0
    assert capsys.readouterr().out == actions.markdown()
    assert "  - Ctrl+Shift+N: New private chat (File menu)\n" in actions.markdown()
    assert "  - Del: Delete the selected conversation (in the conversation list)\n" in actions.markdown()
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n- Keys:\n  {actions.README_BEGIN}\n  - F9: gone\n  {actions.README_END}\n"
                      "End\n")
    assert actions.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert actions.readme_block(text) == actions.markdown() and "F9" not in text and text.endswith("End\n")
    assert actions.write_readme(readme) is False  # up to date
    readme.write_text("# no list\n")
    assert actions.main(["--readme", str(readme)]) == 1
    assert "The README's key list was not written: the README has no key list" in capsys.readouterr().err


def test_menus_toolbar_and_keys_are_built_from_the_declaration(window: MainWindow) -> None:
    menus = {m.title().replace("&", ""): entries(m) for m in (a.menu() for a in window.menuBar().actions())}
    assert menus == MENUS
    toolbar = window.findChild(QToolBar, "main-toolbar")
    assert [a.text().replace("&", "") for a in toolbar.actions()] == TOOLBAR
    for spec in actions.ACTIONS:
        action = window.declared_actions[spec.name]
        assert action.text().replace("&", "") == spec.title.replace("&", ""), spec.name
        assert spec.keys == KEYS.get(spec.title.replace("&", ""), ""), spec.name
        assert action.shortcuts() == spec.key_sequences(), spec.name
        if spec.standard:  # the platform's binding: the README's (Linux') unless the platform has none
            standard = QKeySequence(getattr(QKeySequence.StandardKey, spec.standard))
            assert standard in (QKeySequence(spec.keys), QKeySequence()), spec.name
        else:
            assert action.shortcuts() == ([QKeySequence(spec.keys)] if spec.keys else []), spec.name
    assert window.recent_menu.menuAction() is window.declared_actions["recent"]
    assert window.undo_delete_action is window.declared_actions["undo_delete"]


def test_no_two_actions_share_a_key() -> None:
    keys = [s.toString() for spec in actions.ACTIONS for s in spec.key_sequences()]
    assert len(keys) == len(set(keys)), keys  # Qt runs neither of two actions with the same key


def test_enabled_state_follows_the_declaration(qtbot: QtBot, window: MainWindow, fake: FakeSession) -> None:
    def enabled() -> set[str]:
        return {s.name for s in actions.ACTIONS if not s.dock and getattr(window, s.attribute).isEnabled()}

    always = {"models", "quit", "rename", "search", "private", "shortcuts", "about", "info"}
    assert window.state is UiState.READY
    assert enabled() == always | {"new_private", "open", "recent", "settings", "new_chat"}
    fake.finish_reason = FinishReason.LENGTH  # cut off: it can be continued
    chat(qtbot, window, "Hello!")
    assert enabled() == always | {"new_private", "open", "recent", "settings", "new_chat", "regenerate",
                                  "continue", "edit_last", "copy_reply", "compact", "branch"}
    fake.hold()
    window.chat.send_text("Tell me more.")
    qtbot.waitUntil(fake.waiting.is_set, timeout=WAIT_MS)
    assert window.state is UiState.REPLYING
    assert enabled() == always | {"stop", "copy_reply"}
    with qtbot.waitSignal(window.reply_finished, timeout=WAIT_MS):
        window.stop_action.trigger()
        fake.release()
    settle(qtbot, window)
    assert window.state is UiState.READY and {"new_chat", "settings"} <= enabled() and "stop" not in enabled()


def test_a_changed_declaration_changes_the_window(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window keeps no enabled rule of its own: declare Stop open in every state and it is."""
    changed = tuple(dataclasses.replace(s, when=actions.ANY) if s.name == "stop" else s
                    for s in actions.ACTIONS)
    monkeypatch.setattr(actions, "ACTIONS", changed)
    window.set_state(window.state)
    assert window.state is UiState.READY and window.stop_action.isEnabled()


def test_help_lists_the_declared_keys_as_the_window_binds_them(window: MainWindow) -> None:
    window.shortcuts_action.trigger()
    dialog = window.findChild(ShortcutsDialog)
    table = dialog.table
    rows = [tuple(table.item(r, c).text() for c in range(3)) for r in range(table.rowCount())]
    assert rows == actions.shortcut_rows()
    native = QKeySequence.SequenceFormat.NativeText
    bound = {a.text().replace("&", "").rstrip("…"): a.shortcut().toString(native)
             for a in window.declared_actions.values() if not a.shortcut().isEmpty()}
    shown = {what: keys for what, keys, where in rows if where.endswith(" menu")}
    assert shown == bound
    assert ("Send the message", "Enter", "Message box") in rows
    dialog.reject()


def test_about_gives_the_versions_and_the_build(qtbot: QtBot, window: MainWindow) -> None:
    window.about_action.trigger()
    dialog = window.findChild(AboutDialog)
    assert dialog.isVisible() and dialog.app_label.text() == __version__
    qtbot.waitUntil(lambda: dialog.engine_label.text() != ASKING, timeout=WAIT_MS)
    assert dialog.engine_label.text() == engine_check.check_engine().version
    build = gpu_build()
    assert dialog.backend_label.text() == (f"GPU build ({build})" if build else "CPU build")
    dialog.reject()
    window.about_action.trigger()  # the same dialog, not asked again
    assert window.findChildren(AboutDialog) == [dialog] and window.ops.count == 0


def test_about_says_why_the_engine_cannot_be_used(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> engine_check.EngineInfo:
        raise engine_check.EngineMissingError("llama_cpp 0.3.0 is installed, but LazyKV Chat needs ours")

    monkeypatch.setattr(engine_check, "check_engine", missing)
    assert about_dialog.engine_facts().version.startswith("not usable: llama_cpp 0.3.0 is installed")

    def unreadable() -> about_dialog.EngineFacts:
        raise OSError("no library")

    monkeypatch.setattr(about_dialog, "engine_facts", unreadable)
    window.about_action.trigger()
    dialog = window.findChild(AboutDialog)
    qtbot.waitUntil(lambda: dialog.engine_label.text() != ASKING, timeout=WAIT_MS)
    assert dialog.engine_label.text() == "could not be read: no library"
    dialog.reject()
