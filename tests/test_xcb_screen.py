"""What is on screen is what is saved and what the model sees (issue 30, defects 1-3): the real app,
its real engine and SmolLM2, on Qt's xcb platform under Xvfb with the openbox window manager, driven
by ``tests/support/xcb_app.py`` (keys, clicks, Ctrl+Q)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tools import xcb_smoke

from lazykv.core.history.store import Store
from lazykv.core.settings import Settings
from tests.support.history import append_message, create_conversation

ROOT = Path(__file__).resolve().parent.parent
LONG_PARAGRAPH = ("The lighthouse keeper counted the ships that passed the northern cape each night, writing "
                  "their names, their flags and the hour in a ledger bound in green leather. ")


def _settings(**values: object) -> None:
    """The settings the app will load (the test's own config folder)."""
    settings = Settings()
    for name, value in {"snapshot_encryption": "none", "max_reply_tokens": 12, "temperature": 0.0,
                        "idle_conversion": False, **values}.items():
        settings.set(name, value)
    settings.save()


def _play(scenario: str, model: Path, tmp_path: Path, ctx: int = 1024) -> dict[str, Any]:
    """Start the app on its own X desktop, play ``scenario``, and return what it saw (the app must
    then exit by itself with 0)."""
    missing = xcb_smoke.missing_tools()
    assert not missing, f"missing {missing}: run tools/sysdeps.sh"
    out = tmp_path / f"{scenario}.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with xcb_smoke.x_desktop() as display:
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.xcb_app", scenario, str(out), "--", "--model", str(model),
             "--ctx", str(ctx)],
            env={**env, "DISPLAY": display}, cwd=ROOT, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert out.exists(), f"the scenario wrote nothing (exit {done.returncode}):\n{log}"
    seen = json.loads(out.read_text())
    assert "error" not in seen, f"{seen['error']}\n{seen.get('traceback', '')}\n{seen.get('screen')}\n{log}"
    assert done.returncode == 0, log
    assert "qt.qpa" not in log, log
    return seen


def _contents(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "system"]


@pytest.mark.slow
def test_a_relaunch_lands_on_the_chat_open_at_quit_with_its_cache_resumed(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Defect 1: two saved chats, the older one open at Ctrl+Q; started again with the same folders,
    the window shows that chat (not the newest, not an empty one), highlighted in the list, its
    snapshot resumed and the status bar saying so."""
    _settings()
    first = _play("two_chats_open_the_older", smollm2_path, tmp_path)
    older = first["older"]
    assert first["screen"]["current"] == older and older != first["newer"]

    second = _play("observe_start", smollm2_path, tmp_path)["screen"]

    assert second["current"] == older, second
    assert second["selected"] == older and second["highlighted"] == [older], second
    assert _contents(second["messages"])[0] == "Name a colour.", second
    assert second["resume_note"].startswith("Resumed from the snapshot"), second


@pytest.mark.slow
def test_unticking_private_keeps_screen_saved_history_and_cache_one_conversation(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Defect 2: a saved chat, a turn with Private ticked, Private unticked, "hello again". The model
    is sent exactly the conversation on screen, which is exactly the one saved: never the earlier
    chat's turns (the private one above all), and nothing of them is reused from the cache."""
    _settings()
    seen = _play("private_then_not", smollm2_path, tmp_path)
    screen, saved, hello = seen["screen"], seen["saved"], seen["hello"]

    assert not screen["private"]
    on_screen = _contents(screen["messages"])
    assert _contents(hello["prompt"]) == on_screen[:-1], (hello["prompt"], on_screen)  # all but its reply
    assert screen["current"] is not None
    assert _contents(saved[str(screen["current"])]) == on_screen
    assert not any("purple" in text or "Zorblax" in text for text in on_screen), on_screen
    assert hello["n_reused"] == 0, hello  # the cache held another conversation: nothing of it is used
    story = saved[str(seen["story"])]
    assert not any("purple" in m["content"] for m in story), story  # the private turn was never saved


@pytest.mark.slow
def test_switching_chats_during_a_reread_never_mixes_them(tmp_path: Path, smollm2_path: Path) -> None:
    """Defect 3: a long chat is clicked and, while its transcript is re-read (it has no snapshot),
    another one; the list, the transcript and the saved id all end on the second, and a message sent
    then goes to it and to no other."""
    _settings()
    store = Store()
    try:
        long = create_conversation(store, "A long chat")
        append_message(store, long, "user", "Summarise this: " + LONG_PARAGRAPH * 40)
        append_message(store, long, "assistant", "It is about a lighthouse keeper.")
        short = create_conversation(store, "A short chat")  # the newest: the one a start opens
        append_message(store, short, "user", "Say hi.")
        append_message(store, short, "assistant", "Hi!")
    finally:
        store.close()

    seen = _play("switch_during_reread", smollm2_path, tmp_path, ctx=4096)

    assert (seen["long"], seen["short"]) == (long, short)
    assert seen["state_during"] == "LOADING", "the second click came after the re-read: nothing was tested"
    screen = seen["screen"]
    assert screen["current"] == short and screen["selected"] == short, screen
    assert screen["highlighted"] == [short], screen
    assert _contents(screen["messages"]) == ["Say hi.", "Hi!"], screen
    assert "lighthouse" not in screen["transcript"], screen["transcript"]
    after = seen["after_send"]
    assert after["current"] == short and after["selected"] == short, after
    assert _contents(seen["sent"]["prompt"]) == ["Say hi.", "Hi!", "Which chat is this?"]
    assert _contents(seen["saved"][str(short)])[:3] == ["Say hi.", "Hi!", "Which chat is this?"]
    assert len(seen["saved"][str(long)]) == 2  # nothing was added to the long one
