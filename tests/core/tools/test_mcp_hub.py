"""The MCP hub against tests/support/mcp_server.py, started by the real SDK over stdio and HTTP."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mcp_types as types
import pytest

from lazykv.core.tools.mcp_config import McpServerConfig
from lazykv.core.tools.mcp_hub import (
    McpHub,
    ServerState,
    ToolResult,
    ToolSpec,
    cap_text,
    qualify,
    result_text,
)

SERVER = Path(__file__).resolve().parents[2] / "support" / "mcp_server.py"
TEST_SERVER = McpServerConfig("t", command=sys.executable, args=(str(SERVER),))
CAP = 64 * 1024


def wait_for(predicate: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def server_pid(hub: McpHub, name: str = "t") -> int:
    wait_for(lambda: "pid" in hub.status()[name].stderr)
    return int(re.search(r"mcp test server pid (\d+)", hub.status()[name].stderr).group(1))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def hub() -> Iterator[McpHub]:
    h = McpHub([TEST_SERVER], timeout_s=1, output_cap=CAP)
    h.start()
    wait_for(lambda: h.status()["t"].state is ServerState.READY)
    yield h
    h.close()


@pytest.fixture
def limits(hub: McpHub) -> Iterator[Callable[[float, int], None]]:
    yield hub.set_limits
    hub.set_limits(1, CAP)


def test_tools_are_listed_with_qualified_names_and_openai_shape(hub: McpHub) -> None:
    names = [t.qualified for t in hub.tools()]
    assert names == ["t__echo", "t__add", "t__hang", "t__flood", "t__fail"]
    add = hub.find("t__add")
    assert add is not None and add.server == "t" and add.name == "add"
    function = add.openai_tool()["function"]
    assert add.openai_tool()["type"] == "function" and function["name"] == "t__add"
    assert function["description"] == "Add two numbers."
    assert set(function["parameters"]["properties"]) == {"a", "b"}
    assert hub.status()["t"].message == "Ready: 5 tools."


def test_add_and_echo(hub: McpHub) -> None:
    assert hub.call("t__add", {"a": 2, "b": 3}, threading.Event()) == ToolResult("5", False, False)
    assert hub.call("t__echo", {"text": "<b>hi</b>"}, threading.Event()).text == "<b>hi</b>"


def test_hang_times_out(hub: McpHub) -> None:
    started = time.monotonic()
    result = hub.call("t__hang", {}, threading.Event())
    assert 0.9 < time.monotonic() - started < 3
    assert result.is_error and result.text == "The tool did not answer within 1 s."


def test_cancel_returns_promptly(hub: McpHub, limits: Callable[[float, int], None]) -> None:
    limits(30, CAP)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    result = hub.call("t__hang", {}, cancel)
    assert time.monotonic() - started < 1.0
    assert result == ToolResult("Cancelled", True, False)


def test_flood_is_cut_at_the_cap(hub: McpHub, limits: Callable[[float, int], None]) -> None:
    limits(30, 1000)
    result = hub.call("t__flood", {}, threading.Event())
    assert result.truncated and not result.is_error
    assert result.text == "x" * 1000
    assert result.for_model().startswith("x" * 1000) and "cut" in result.for_model()


def test_fail_is_an_error_result(hub: McpHub) -> None:
    result = hub.call("t__fail", {}, threading.Event())
    assert result.is_error and "fail" in result.text


def test_unknown_tool_is_a_key_error(hub: McpHub) -> None:
    with pytest.raises(KeyError):
        hub.call("t__nope", {}, threading.Event())


def test_missing_command_fails_with_a_sentence() -> None:
    missing = McpServerConfig("gone", command="/nonexistent/lazykv-mcp-server")
    h = McpHub([missing], timeout_s=1, output_cap=CAP)
    changes: list[int] = []
    h.on_change(lambda: changes.append(1))
    h.start()
    try:
        wait_for(lambda: h.status()["gone"].state is ServerState.FAILED)
        status = h.status()["gone"]
        assert "/nonexistent/lazykv-mcp-server" in status.message and "not found" in status.message
        assert status.stderr == ""
        assert h.tools() == [] and changes
    finally:
        h.close()


def test_server_dying_at_start_shows_its_stderr() -> None:
    crash = McpServerConfig("crash", command=sys.executable,
                            args=("-c", "import sys; sys.stderr.write('boom: no config\\n'); sys.exit(3)"))
    h = McpHub([crash], timeout_s=1, output_cap=CAP)
    h.start()
    try:
        wait_for(lambda: h.status()["crash"].state is ServerState.FAILED)
        status = h.status()["crash"]
        assert "ended before it was ready" in status.message
        wait_for(lambda: "boom: no config" in h.status()["crash"].stderr)
    finally:
        h.close()


def test_a_killed_server_is_failed_and_its_calls_are_errors() -> None:
    h = McpHub([TEST_SERVER], timeout_s=5, output_cap=CAP)
    h.start()
    try:
        wait_for(lambda: h.status()["t"].state is ServerState.READY)
        os.kill(server_pid(h), signal.SIGKILL)
        wait_for(lambda: h.status()["t"].state is ServerState.FAILED, timeout=5)
        assert "stopped" in h.status()["t"].message
        assert h.tools() == []
    finally:
        h.close()


def test_close_ends_the_server_process_even_mid_call() -> None:
    h = McpHub([TEST_SERVER], timeout_s=60, output_cap=CAP)
    h.start()
    wait_for(lambda: h.status()["t"].state is ServerState.READY)
    pid = server_pid(h)
    results: list[ToolResult] = []
    caller = threading.Thread(target=lambda: results.append(h.call("t__hang", {}, threading.Event())))
    caller.start()
    time.sleep(0.3)
    started = time.monotonic()
    h.close()
    assert time.monotonic() - started < 10
    wait_for(lambda: gone(pid), timeout=3)
    caller.join(5)
    assert results and results[0].is_error


def test_set_servers_disables_and_reenables() -> None:
    h = McpHub([TEST_SERVER], timeout_s=5, output_cap=CAP)
    h.start()
    try:
        wait_for(lambda: h.status()["t"].state is ServerState.READY)
        pid = server_pid(h)
        h.set_servers([McpServerConfig("t", command=sys.executable, args=(str(SERVER),), enabled=False)])
        assert h.status()["t"].state is ServerState.DISABLED and h.tools() == []
        wait_for(lambda: gone(pid), timeout=8)
        h.set_servers([TEST_SERVER])
        wait_for(lambda: h.status()["t"].state is ServerState.READY)
        assert h.find("t__add") is not None
    finally:
        h.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_lists_its_tools() -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stderr=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening)
        h = McpHub([McpServerConfig("web", url=f"http://127.0.0.1:{port}/mcp")], timeout_s=5, output_cap=CAP)
        h.start()
        try:
            wait_for(lambda: h.status()["web"].state is not ServerState.STARTING)
            assert h.status()["web"].state is ServerState.READY, h.status()["web"].message
            assert [t.name for t in h.tools()] == ["echo", "add", "hang", "flood", "fail"]
            assert h.call("web__add", {"a": 2, "b": 3}, threading.Event()).text == "5"
        finally:
            h.close()
    finally:
        proc.terminate()
        proc.wait(5)


def test_unreachable_url_fails_with_a_sentence() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    h = McpHub([McpServerConfig("web", url=url)], timeout_s=1, output_cap=CAP, connect_timeout_s=5)
    h.start()
    try:
        wait_for(lambda: h.status()["web"].state is ServerState.FAILED)
        assert url in h.status()["web"].message
    finally:
        h.close()


def test_qualified_names_are_valid_and_unique() -> None:
    assert qualify("files", "read_file") == "files__read_file"
    odd = qualify("my server", "read.file")
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", odd) and odd != qualify("my_server", "read_file")
    long = qualify("s" * 40, "t" * 40)
    assert len(long) == 64 and long != qualify("s" * 40, "t" * 41)
    # "a__b" + "c" and "a" + "b__c" meet: the hub gives the second its hashed form
    assert ToolSpec("a__b", "c", "", {}).qualified == ToolSpec("a", "b__c", "", {}).qualified
    assert qualify("a", "b__c", hashed=True) != "a__b__c"


def test_result_text_names_content_it_does_not_open() -> None:
    result = types.CallToolResult(content=[
        types.TextContent(text="one"),
        types.ImageContent(data="AAAA", mime_type="image/png"),
        types.ResourceLink(name="f", uri="file:///tmp/f.txt"),
    ])
    assert result_text(result) == "one\n[image: image/png]\n[resource link: file:///tmp/f.txt]"
    assert result_text(types.CallToolResult(content=[], structured_content={"n": 5})) == '{"n": 5}'


def test_cap_text_never_cuts_inside_a_character() -> None:
    assert cap_text("ab", 5) == ("ab", False)
    assert cap_text("a\u00e9\u00e9", 4) == ("a\u00e9", True)  # é is two bytes: the second one is left out
