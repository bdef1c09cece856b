"""line_cap: a stdio MCP server's messages held to a size in a process of its own, so that the app never
parses a flood (the MCP SDK parses each message holding Python's lock)."""

from __future__ import annotations

import json

from lazykv.core.tools import line_cap


def line(message: dict) -> bytes:
    return json.dumps(message).encode() + b"\n"


def test_a_short_message_passes_as_it_is() -> None:
    msg = line({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "5"}]}})
    assert line_cap.shrink(msg, 1000) is msg


def test_a_flooding_result_is_cut_one_byte_past_the_cap_its_structure_kept() -> None:
    text = "é" * 3_000_000
    msg = line({"jsonrpc": "2.0", "id": 7, "result": {
        "content": [{"type": "text", "text": text}, {"type": "image", "data": "x" * 10}],
        "structuredContent": {"result": text}, "isError": False}})
    out = json.loads(line_cap.shrink(msg, 1000))
    assert out["id"] == 7 and not out["result"]["isError"]
    assert len(out["result"]["content"][0]["text"].encode()) == 1000  # 1001 bytes less a split character
    assert len(out["result"]["structuredContent"]["result"].encode()) <= 1001
    assert len(line_cap.shrink(msg, 1000)) < 10_000


def test_another_long_message_becomes_its_requests_error_and_a_long_notification_is_dropped() -> None:
    tools = line({"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "x" * 200_000}]}})
    out = json.loads(line_cap.shrink(tools, 1000))
    assert out["id"] == 3 and "longer than 1000 bytes" in out["error"]["message"]
    note = line({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 200_000}})
    assert line_cap.shrink(note, 1000) == b""
    assert line_cap.shrink(b"not json" * 100_000 + b"\n", 1000) == b""
