"""Issue 45, defect 2 on a real desktop: the app on Qt's xcb platform under Xvfb with the openbox window
manager (tests/support/xcb_app.py), a passphrase chosen before. A wrong one typed at start is said in the
prompt, which keeps the focus with the wrong text selected, and no other window is up (Qt's view and the
window manager's list); after the right one, typed over the selection, only the main window is left."""

from __future__ import annotations

from pathlib import Path

from lazykv.core.history.protection import passphrase_lock
from tests.test_xcb_screen import _play, _settings

RIGHT, WRONG = "correct horse", "wrong horse"


def test_a_wrong_passphrase_is_said_in_the_prompt_and_nothing_stale_follows_the_right_one(
    tmp_path: Path, smollm2_path: Path
) -> None:
    _settings(snapshot_encryption="passphrase")
    passphrase_lock().create(RIGHT, RIGHT)

    seen = _play("wrong_then_right_passphrase", smollm2_path, tmp_path)

    wrong = seen["after_wrong"]
    *shown, listed = wrong["windows"]
    names = sorted(window["name"] for window in shown)
    assert len(shown) == 2 and "passphrase-dialog" in names, wrong  # the main window and the prompt
    [prompt] = [window for window in shown if window["name"] == "passphrase-dialog"]
    assert any("not the passphrase" in text for text in prompt["labels"]), prompt
    assert len(listed["wm"]) == 2, listed  # nothing else the window manager shows, behind or in front
    assert wrong["focus"] == "QLineEdit" and wrong["focus_window"] == "passphrase-dialog", wrong
    assert wrong["focus_text"] == WRONG and wrong["selected"] == WRONG, wrong

    *shown, listed = seen["after_right"]["windows"]
    assert [window["class"] for window in shown] == ["MainWindow"], shown
    assert len(listed["wm"]) == 1 and listed["wm"][0].endswith("LazyKV Chat"), listed
