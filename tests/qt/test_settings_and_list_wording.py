"""Issue 12's wording in Settings and the conversation list: what 0 means, a reload said before it
happens, Restore Defaults within what works, the rename box, rows told apart."""

from __future__ import annotations

from pathlib import Path

import keyring
from keyring.backends import fail
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QInputDialog, QLabel, QSpinBox
from pytestqt.qtbot import QtBot

from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.history.persistence import OpenHow, OpenResult
from lazykv.core.history.records import ConversationSummary
from lazykv.core.settings import Settings
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.settings_dialog import SettingsDialog
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, chat


def _dialog(qtbot: QtBot, settings: Settings | None = None, **kwargs: object) -> SettingsDialog:
    dialog = SettingsDialog(settings or Settings(), **kwargs)  # type: ignore[arg-type]
    qtbot.addWidget(dialog)
    return dialog


def test_zero_values_say_what_they_mean(qtbot: QtBot) -> None:
    dialog = _dialog(qtbot)
    shown = {"n_threads": (0, "0 = automatic (one per core)"), "max_reply_tokens": (0, "0 = no limit"),
             "top_k": (0, "0 = all tokens"), "seed": (-1, "-1 = random each time"),
             "temperature": (0.0, "0 = always the likeliest"), "n_gpu_layers": (-1, "Auto (as many as fit)"),
             "gpu_memory_mb": (0, "0 = free memory less 1 GiB")}
    for name, (value, text) in shown.items():
        dialog.set_value(name, value)
        spin = dialog.editors[name]
        assert isinstance(spin, QSpinBox | QDoubleSpinBox)
        assert spin.text() == text, name
    dialog.set_value("n_threads", 4)
    assert dialog.editors["n_threads"].text() == "4"  # other values as they are


def test_a_change_that_reloads_the_model_says_so_before_ok(qtbot: QtBot, fake_model: Path) -> None:
    dialog = _dialog(qtbot, meta=read_model_meta(fake_model))
    dialog.show()
    assert not dialog.reload_note.isVisible()
    dialog.set_value("temperature", 0.3)  # applied without a reload
    assert not dialog.reload_note.isVisible()
    dialog.set_value("n_ctx", 2048)
    assert dialog.reload_note.isVisible() and "context memory is emptied" in dialog.reload_note.text()
    dialog.set_value("n_ctx", Settings()["n_ctx"])
    assert not dialog.reload_note.isVisible()
    no_model = _dialog(qtbot)  # nothing loaded: nothing to empty
    no_model.show()
    no_model.set_value("n_ctx", 2048)
    assert not no_model.reload_note.isVisible()


def test_restore_defaults_keeps_a_protection_scheme_that_works(qtbot: QtBot) -> None:
    settings = Settings()
    settings.set("snapshot_encryption", "none")
    settings.set("temperature", 1.5)
    dialog = _dialog(qtbot, settings, keyring_works=False)
    dialog.restore_defaults()
    assert dialog.value("snapshot_encryption") == "none"  # the default, keyring, does not work here
    assert dialog.value("temperature") == Settings()["temperature"]  # the rest restored
    combo = dialog.editors["snapshot_encryption"]
    assert isinstance(combo, QComboBox)
    item = combo.model().item(combo.findData("keyring"))
    assert not item.isEnabled() and "not available" in item.toolTip()
    working = _dialog(qtbot, settings, keyring_works=True)
    working.restore_defaults()
    assert working.value("snapshot_encryption") == "keyring"


def test_the_window_knows_when_the_keyring_failed(qtbot: QtBot, fake_window: FakeWindow) -> None:
    keyring.set_keyring(fail.Keyring())
    w = fake_window(snapshot_encryption="keyring")
    qtbot.waitUntil(lambda: w.conversations.keyring_failed, timeout=WAIT_MS)
    w.settings_action.trigger()
    qtbot.waitUntil(lambda: getattr(w, "settings_dialog", None) is not None, timeout=WAIT_MS)
    w.settings_dialog.restore_defaults()
    assert w.settings_dialog.value("snapshot_encryption") == "keyring"  # the current one: kept
    w.settings_dialog.set_value("snapshot_encryption", "none")
    w.settings_dialog.restore_defaults()
    assert w.settings_dialog.value("snapshot_encryption") == "none"
    w.settings_dialog.reject()


def test_the_rename_box_starts_with_the_current_title(qtbot: QtBot, fake_window: FakeWindow) -> None:
    w = fake_window()
    chat(qtbot, w, "A title worth keeping")
    qtbot.waitUntil(lambda: w.conversations_panel.title(w.conversations.current) is not None, timeout=WAIT_MS)
    w.conversations.ask_rename(w.conversations.current)
    dialog = w.findChild(QInputDialog, "rename-dialog")
    assert dialog is not None and dialog.textValue() == "A title worth keeping"
    dialog.reject()


def _texts(panel: ConversationsPanel) -> list[str]:
    return [panel.list.item(i).text() for i in range(panel.list.count())]


def test_rows_with_the_same_title_can_be_told_apart(qtbot: QtBot) -> None:
    panel = ConversationsPanel()
    qtbot.addWidget(panel)
    same = [ConversationSummary(1, "Hello", 1.7e9, 1.7e9 + 30, 2), ConversationSummary(2, "Hello", 1.7e9 + 5,
                                                                                      1.7e9 + 30, 2)]
    panel.set_conversations([*same, ConversationSummary(3, "Other", 1.7e9, 1.7e9, 2)], None)
    first, second, other = _texts(panel)
    assert first != second and "started" in first and "started" in second
    assert "started" not in other
    panel.upsert(ConversationSummary(2, "Renamed", 1.7e9 + 5, 1.7e9 + 40, 2), selected=False)
    assert not any("started" in text for text in _texts(panel))  # no longer the same title
    panel.upsert(ConversationSummary(4, "Other", 1.7e9 + 9, 1.7e9 + 50, 2), selected=False)
    assert sum("started" in text for text in _texts(panel)) == 2
    panel.remove(4)
    assert not any("started" in text for text in _texts(panel))


def test_list_rows_are_visibly_separated(qtbot: QtBot) -> None:
    panel = ConversationsPanel()
    qtbot.addWidget(panel)
    panel.resize(260, 400)
    panel.set_conversations([ConversationSummary(i, f"Chat {i}", 1.7e9, 1.7e9 - i, 2) for i in (1, 2)], None)
    panel.show()
    qtbot.waitExposed(panel)
    image = panel.list.viewport().grab().toImage()
    rects = [panel.list.visualItemRect(panel.list.item(i)) for i in range(2)]
    # the right edge of each row: past the text, the row's own background
    colours = [image.pixelColor(rect.right() - 2, rect.center().y()).name() for rect in rects]
    assert colours[0] != colours[1], colours


def test_a_re_read_says_why_in_plain_words_and_the_layout_on_demand(
    qtbot: QtBot, fake_window: FakeWindow
) -> None:
    w = fake_window()
    technical = "it was saved with another KV cache layout (K/V q8_0/q8_0, rotation 64/64)"
    w.chat.end_resume(OpenResult(OpenHow.REBUILT, "it was saved with other context-memory settings", 12, 0.2,
                            technical))
    banner = w.banner
    assert banner.isVisible() and "other context-memory settings" in banner.label.text()
    assert "K/V" not in banner.label.text() and banner.details_button.isVisible()
    banner.details_button.click()
    assert technical in banner.label.text() and not banner.details_button.isVisible()
    w.chat.end_resume(OpenResult(OpenHow.RESTORED, "", 12, 0.01))  # no details: no button
    assert not banner.details_button.isVisible()


def test_settings_say_what_no_encryption_does_not_protect_against(qtbot: QtBot) -> None:
    """Issue 24.5: without encryption a snapshot can only be bound to the sha256 its database row records;
    the dialog says, under the choice, what that leaves open."""
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    note = dialog.findChild(QLabel, "snapshot_encryption-note")
    assert note is not None
    dialog.set_value("snapshot_encryption", "none")
    assert note.text().startswith("Not protected against anyone who can read or change your files")
    assert "change a snapshot together with its record" in note.text()
    dialog.set_value("snapshot_encryption", "passphrase")
    assert "encrypted under your passphrase" in note.text()
