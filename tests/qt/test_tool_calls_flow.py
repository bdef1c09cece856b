"""The model's tool calls in the window (fake engine, a real MCP server over stdio written with the SDK):
asked about before running, Allow once / Always / Deny, the result reaching the model's next prompt, a
hanging tool timed out with the window responsive, Stop during a call."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.core.kinds import ToolStatus
from lazykv.core.tools import mcp_config
from lazykv.core.tools.mcp_hub import ServerState
from lazykv.qt.main_window import MainWindow
from lazykv.qt.tool_consent import ToolConsentDialog
from lazykv.qt.ui_state import UiState
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import WAIT_MS, chat

SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"


def call(name: str, arguments: dict, id_: str = "call00001") -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def window_with_server(qtbot: QtBot, fake_window: FakeWindow, **settings: object) -> MainWindow:
    server = mcp_config.McpServerConfig(name="t", command=sys.executable, args=(str(SERVER),))
    mcp_config.save_servers([server])
    w = fake_window(**settings)
    hub = w.tool_calls.hub
    assert hub is not None
    qtbot.waitUntil(lambda: hub.status()["t"].state is ServerState.READY, timeout=30_000)
    return w


def consent(qtbot: QtBot, w: MainWindow) -> ToolConsentDialog:
    found: list[ToolConsentDialog] = []
    qtbot.waitUntil(lambda: bool(found.extend(w.findChildren(ToolConsentDialog)) or found)
                    and found[-1].isVisible(), timeout=WAIT_MS)
    return found[-1]


def tool_turns(w: MainWindow) -> list[dict]:
    return [m for m in w.conversation.messages() if m["role"] == "tool"]


def test_allow_once_runs_the_call_and_the_model_reads_its_result(qtbot: QtBot, fake_window: FakeWindow,
                                                                 fake: FakeSession) -> None:
    w = window_with_server(qtbot, fake_window)
    fake.tool_replies = [[call("t__add", {"a": 2, "b": 3})]]
    chat_started = time.monotonic()
    w.input.setPlainText("What is 2 + 3?")
    w.chat.send()
    dialog = consent(qtbot, w)
    assert "\"a\": 2" in dialog.arguments.toPlainText()
    assert w.state is UiState.REPLYING
    dialog.allow_once.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 2, timeout=30_000)
    assert tool_turns(w)[0]["content"] == "5"
    second_messages, second_tools = fake.sent[1]
    result = {"role": "tool", "tool_call_id": "call00001", "name": "t__add", "content": "5"}
    assert second_messages[-1] == result
    assert second_tools is not None and {t["function"]["name"] for t in second_tools.tools} >= {"t__add"}
    assert w.conversation.messages()[-1]["role"] == "assistant"  # the model answered after the result
    assert not w.tool_calls.consent.allowed("t", "add")  # once is not remembered
    assert time.monotonic() - chat_started < 60


def test_deny_tells_the_model_and_always_is_remembered(qtbot: QtBot, fake_window: FakeWindow,
                                                       fake: FakeSession) -> None:
    w = window_with_server(qtbot, fake_window)
    fake.tool_replies = [[call("t__echo", {"text": "<b>hi</b>"})]]
    w.input.setPlainText("Say hi")
    w.chat.send()
    consent(qtbot, w).deny.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 2, timeout=30_000)
    denied = tool_turns(w)[0]
    assert "did not allow" in denied["content"]
    assert w.conversation.turns()[-2]["tool"]["status"] == ToolStatus.DENIED

    fake.tool_replies = [[call("t__echo", {"text": "again"}, "call00002")]]
    w.input.setPlainText("Say it again")
    w.chat.send()
    consent(qtbot, w).always.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 4, timeout=30_000)
    assert tool_turns(w)[-1]["content"] == "again"
    assert w.tool_calls.consent.allowed("t", "echo")
    fake.tool_replies = [[call("t__echo", {"text": "third"}, "call00003")]]
    chat(qtbot, w, "Once more")  # always allowed: no question
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 6, timeout=30_000)
    assert tool_turns(w)[-1]["content"] == "third"
    assert not [d for d in w.findChildren(ToolConsentDialog) if d.isVisible()]


def test_a_hanging_tool_times_out_and_stop_ends_a_call(qtbot: QtBot, fake_window: FakeWindow,
                                                       fake: FakeSession) -> None:
    w = window_with_server(qtbot, fake_window, tool_timeout_s=1)
    fake.tool_replies = [[call("t__hang", {})]]
    w.input.setPlainText("Wait for it")
    w.chat.send()
    consent(qtbot, w).allow_once.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 2, timeout=30_000)
    result = tool_turns(w)[0]
    assert "within 1 s" in result["content"] or "did not answer" in result["content"], result

    w.apply_settings({"tool_timeout_s": 60})
    fake.tool_replies = [[call("t__hang", {}, "call00002")]]
    w.input.setPlainText("Wait again")
    w.chat.send()
    consent(qtbot, w).allow_once.click()
    qtbot.wait(300)
    assert w.state is UiState.REPLYING
    w.chat.stop_reply()
    qtbot.waitUntil(lambda: w.state is UiState.READY, timeout=10_000)
    assert w.conversation.turns()[-1]["tool"]["status"] == ToolStatus.CANCELLED
    assert len(fake.sent) == 3  # stopped: the model was not asked again


def test_an_output_longer_than_the_context_holds_is_cut_to_fit(qtbot: QtBot, fake_window: FakeWindow,
                                                                fake: FakeSession) -> None:
    w = window_with_server(qtbot, fake_window)
    fake.tool_replies = [[call("t__flood", {})]]
    w.input.setPlainText("Flood")
    w.chat.send()
    consent(qtbot, w).allow_once.click()
    qtbot.waitUntil(lambda: w.state is UiState.READY and len(fake.sent) == 2, timeout=30_000)
    result = w.conversation.turns()[-2]
    assert result["role"] == "tool" and result["tool"]["truncated"]
    assert len(result["content"].encode()) <= 2 * w.context_tokens() + 200  # the note that it was cut

