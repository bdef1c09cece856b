"""The list's selection owns what is on screen (issue 45, defect 1), with the real app, its real engine and
SmolLM2 on Qt's xcb platform under Xvfb and openbox: the Down key pressed in the conversation list while
a chat's transcript is re-read opens the chat it moves to, and the transcript, the context bar and the
message sent next all follow it.

The scenario is played by ``tests/support/xcb_app.py``'s driver; this module adds it to the driver's
scenarios when run as ``python -m tests.test_selection_xcb SCENARIO OUT.json -- [app arguments]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lazykv.core.history.store import Store
from lazykv.core.settings import Settings
from tests.support.history import append_message, create_conversation
from tests.support.xcb_run import play

PARAGRAPH = ("The lighthouse keeper counted the ships that passed the northern cape each night, writing "
             "their names, their flags and the hour in a ledger bound in green leather. ")


def down_key_during_reread(d: Any) -> dict[str, Any]:
    """Two saved chats without snapshots; the long one clicked and, while its transcript is re-read, the
    Down (or Up) key pressed in the list to the short one; then a message sent."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from tests.support.xcb_app import pause, wait_until

    w = d.w
    d.model_loaded()
    d.settled()
    d.listed(2)
    panel = w.conversations_panel
    by_title = {panel.title(conv_id): conv_id for conv_id in panel.ids()}
    long_id, short_id = by_title["A long chat"], by_title["A short chat"]
    if w.conversations.current != short_id:
        d.click_row(short_id)
        wait_until(lambda: w.conversations.current == short_id, "the short chat")
        d.settled()
    d.click_row(long_id)
    wait_until(lambda: w.conversations.resume is not None and w.conversations.current == long_id,
               "the re-read to start")
    pause(300)
    during = {"state": w.state.name, "banner": w.banner.label.text()}
    key = Qt.Key.Key_Down if panel.ids().index(short_id) > panel.ids().index(long_id) else Qt.Key.Key_Up
    panel.list.setFocus()
    QTest.keyClick(panel.list, key)
    pause(300)
    d.settled()
    shown = {**d.screen(), "kv_used": w.kv.n_cells_used if w.kv else None,
             "meter": w.context_meter.label.text(), "memory": w.memory_panel.rung_label.text()}
    sent = d.send("Which chat is this?")
    return {"long": long_id, "short": short_id, "key": key.name, "during": during, "screen": shown,
            "after_send": d.screen(), "sent": sent, "saved": d.saved()}


def _contents(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "system"]


@pytest.mark.slow
def test_the_down_key_during_a_reread_opens_the_chat_it_moves_to(tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings()
    for name, value in {"snapshot_encryption": "none", "max_reply_tokens": 12, "temperature": 0.0,
                        "idle_conversion": False}.items():
        settings.set(name, value)
    settings.save()
    store = Store()
    try:
        short = create_conversation(store, "A short chat")
        append_message(store, short, "user", "Say hi.")
        append_message(store, short, "assistant", "Hi!")
        long = create_conversation(store, "A long chat")  # the newest: the list's first row
        append_message(store, long, "user", "Summarise this: " + PARAGRAPH * 40)
        append_message(store, long, "assistant", "It is about a lighthouse keeper.")
    finally:
        store.close()

    out = tmp_path / "down_key_during_reread.json"
    seen, _ = play("tests.test_selection_xcb", "down_key_during_reread", out,
                   ["--model", str(smollm2_path), "--ctx", "4096"])

    assert (seen["long"], seen["short"]) == (long, short)
    assert seen["during"]["state"] == "LOADING", "the key came after the re-read: nothing was tested"
    assert "Re-reading the conversation" in seen["during"]["banner"], seen["during"]
    screen = seen["screen"]
    assert screen["current"] == screen["selected"] == short and screen["highlighted"] == [short], screen
    assert _contents(screen["messages"]) == ["Say hi.", "Hi!"], screen
    assert "lighthouse" not in screen["transcript"], screen["transcript"]
    assert 0 < screen["kv_used"] < 100, screen  # the context holds the short chat, not the long one
    assert f"Context {screen['kv_used']:,} /" in screen["meter"], screen
    after = seen["after_send"]
    assert after["current"] == short and after["selected"] == short, after
    assert _contents(seen["sent"]["prompt"]) == ["Say hi.", "Hi!", "Which chat is this?"]
    assert _contents(seen["saved"][str(short)])[:3] == ["Say hi.", "Hi!", "Which chat is this?"]
    assert len(seen["saved"][str(long)]) == 2  # nothing was added to the long one


if __name__ == "__main__":
    from tests.support import xcb_app

    xcb_app.SCENARIOS[down_key_during_reread.__name__] = down_key_during_reread
    sys.exit(xcb_app.main(sys.argv[1:]))
