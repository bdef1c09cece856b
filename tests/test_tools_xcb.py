"""Tools in the real app (issue 48) with its real engine and SmolLM2 on Qt's xcb platform under Xvfb and
openbox, an MCP server over stdio written with the SDK (tests/support/mcp_server.py): the model is made to
call ``add``; the consent dialog shows the call; Allow once runs it; its result reaches the model, which
answers; the call and its result are saved with the conversation. Then a call denied: the model is told.

Run by ``tests/support/xcb_app.py``'s driver: ``python -m tests.test_tools_xcb SCENARIO OUT.json -- ARGS``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from lazykv.core.settings import Settings
from lazykv.core.tools import mcp_config
from tests.support.xcb_run import play

SERVER = Path(__file__).resolve().parent / "support" / "mcp_server.py"
SHOT = "LAZYKV_TOOLS_SCREENSHOT"  # where the scenario saves the window with the approved call


def approve_then_deny(d: Any) -> dict[str, Any]:
    import os

    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtTest import QTest

    from lazykv.core.tools.mcp_hub import ServerState
    from lazykv.qt.tool_consent import ToolConsentDialog
    from tests.support.xcb_app import wait_until

    w = d.w
    d.model_loaded()
    d.settled()
    hub = w.tool_calls.hub
    wait_until(lambda: hub.status()["t"].state is ServerState.READY, "the MCP server", 60)
    seen: list[dict[str, Any]] = []

    def answer(button: str) -> None:
        dialogs = [x for x in w.findChildren(ToolConsentDialog) if x.isVisible()]
        if not dialogs:
            QTimer.singleShot(50, lambda: answer(button))
            return
        dialog = dialogs[-1]
        seen.append({"arguments": dialog.arguments.toPlainText(), "tool": dialog.spec.name,
                     "server": dialog.spec.server})
        getattr(dialog, button).click()

    results = {}
    for text, tool, button in (("What is 2 + 3?", "t__add", "allow_once"),
                               ("Say hello with the echo tool.", "t__echo", "deny")):
        w.tool_calls.force_next(tool)
        QTimer.singleShot(50, lambda b=button: answer(b))
        before = len(d.replies)
        w.input.setFocus()
        QTest.keyClicks(w.input, text)
        QTest.keyClick(w.input, Qt.Key.Key_Return)
        wait_until(lambda b=before: len(d.replies) > b, f"the answer to {text!r}", 120)
        d.settled()
        results[tool] = [dict(m) for m in w.conversation.turns()]
        if tool == "t__add" and os.environ.get(SHOT):
            view = w.transcript
            calls = next(i for i, m in enumerate(w.conversation.shown()) if m.get("tool_calls"))
            view.toggle_tool_block(calls, 0)
            view.toggle_tool_block(calls + 1, 0)
            d.settled()
            w.grab().save(os.environ[SHOT])
    return {"consent": seen, "turns": results, "saved": d.saved()}


@pytest.mark.slow
def test_a_forced_call_is_asked_about_run_answered_and_saved_and_a_denied_one_told(
        tmp_path: Path, smollm2_path: Path) -> None:
    settings = Settings()
    for name, value in {"snapshot_encryption": "none", "max_reply_tokens": 64, "temperature": 0.0,
                        "idle_conversion": False}.items():
        settings.set(name, value)
    settings.save()
    server = mcp_config.McpServerConfig(name="t", command=sys.executable, args=(str(SERVER),))
    mcp_config.save_servers([server])

    seen, _ = play("tests.test_tools_xcb", "approve_then_deny", tmp_path / "tools.json",
                   ["--model", str(smollm2_path), "--ctx", "2048"])
    asked = seen["consent"]
    assert [(a["server"], a["tool"]) for a in asked] == [("t", "add"), ("t", "echo")]
    args = json.loads(asked[0]["arguments"])
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    turns = seen["turns"]["t__add"]
    call = next(t for t in turns if t.get("tool_calls"))
    result = next(t for t in turns if t["role"] == "tool")
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    assert result["content"] == str(args["a"] + args["b"]) and result["tool"]["status"] == "ok"
    assert turns[-1]["role"] == "assistant" and turns[-1]["content"].strip()  # answered after the result
    denied = [t for t in seen["turns"]["t__echo"] if t["role"] == "tool"][-1]
    assert denied["tool"]["status"] == "denied" and "did not allow" in denied["content"]
    assert seen["turns"]["t__echo"][-1]["role"] == "assistant"
    saved = next(iter(seen["saved"].values()))
    assert [m["role"] for m in saved].count("tool") == 2


if __name__ == "__main__":
    from tests.support import xcb_app

    xcb_app.SCENARIOS.update({f.__name__: f for f in (approve_then_deny,)})
    sys.exit(xcb_app.main(sys.argv[1:]))
