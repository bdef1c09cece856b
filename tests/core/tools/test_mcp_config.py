"""mcp.json: Claude Desktop's shape read, bad input refused with a sentence, imports merged by name."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from lazykv.core.paths import mcp_file
from lazykv.core.tools.mcp_config import (
    McpConfigError,
    McpServerConfig,
    import_mcp_json,
    load_servers,
    parse_mcp_json,
    save_servers,
)

CLAUDE_DESKTOP = """{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"],
      "env": {"DEBUG": "1"}
    },
    "remote": {"type": "http", "url": "https://example.com/mcp", "headers": {"Authorization": "Bearer k"}},
    "off": {"command": "uvx", "args": ["mcp-server-time"], "disabled": true}
  }
}"""


def test_claude_desktop_shape() -> None:
    fs, remote, off = parse_mcp_json(CLAUDE_DESKTOP)
    assert fs == McpServerConfig("filesystem", command="npx", env={"DEBUG": "1"},
                                 args=("-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"))
    assert fs.transport == "stdio" and fs.enabled
    assert remote.url == "https://example.com/mcp" and remote.headers == {"Authorization": "Bearer k"}
    assert remote.transport == "http"
    assert off.name == "off" and not off.enabled


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "not valid JSON (line 1"),
    ('{"servers": {}}', "mcpServers"),
    ('{"mcpServers": {"a": {"command": "x", "args": "-y"}}}',
     "\u201ca\u201d: \u201cargs\u201d should be a list"),
    ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}',
     "\u201cenv\u201d should be an object of strings"),
    ('{"mcpServers": {"a": {"command": 5}}}', "\u201ccommand\u201d should be a string"),
    ('{"mcpServers": {"a": {}}}', "needs a command to run or a URL"),
    ('{"mcpServers": {"a": {"url": "ftp://x"}}}', "does not start with http"),
    ('{"mcpServers": {"a": {"type": "sse", "url": "http://x/sse"}}}', "speaks stdio and streamable HTTP"),
    ('{"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}', "should be true or false"),
    ('{"mcpServers": {"a": ["x"]}}', "should be an object"),
])
def test_bad_input_gets_a_sentence(text: str, words: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        parse_mcp_json(text)
    assert words in str(caught.value) and str(caught.value).endswith(".")


def test_save_and_load_round_trip_owner_only() -> None:
    servers = parse_mcp_json(CLAUDE_DESKTOP)
    save_servers(servers)
    assert load_servers() == servers
    if sys.platform != "win32":
        assert stat.S_IMODE(mcp_file().stat().st_mode) == 0o600
    assert load_servers(mcp_file().parent / "none.json") == []


def test_damaged_saved_file_names_itself() -> None:
    mcp_file().parent.mkdir(parents=True, exist_ok=True)
    mcp_file().write_text("{", encoding="utf-8")
    with pytest.raises(McpConfigError, match=str(mcp_file())):
        load_servers()


def test_import_merges_by_name(tmp_path: Path) -> None:
    save_servers([McpServerConfig("keep", command="a"), McpServerConfig("filesystem", command="old")])
    imported = tmp_path / "mcp.json"
    imported.write_text(CLAUDE_DESKTOP, encoding="utf-8")
    merged = import_mcp_json(imported)
    assert [s.name for s in merged] == ["keep", "filesystem", "remote", "off"]
    assert merged[1].command == "npx"
    assert load_servers() == merged
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mcpServers": {"x": {}}}), encoding="utf-8")
    with pytest.raises(McpConfigError, match="bad.json"):
        import_mcp_json(bad)
    assert load_servers() == merged  # a refused import changes nothing


def test_a_server_is_checked_when_made() -> None:
    with pytest.raises(McpConfigError, match="both a command and a URL"):
        McpServerConfig("x", command="a", url="http://h/mcp")
    with pytest.raises(McpConfigError, match="needs a name"):
        McpServerConfig(" ", command="a")
    with pytest.raises(McpConfigError, match="same name"):
        save_servers([McpServerConfig("x", command="a"), McpServerConfig("x", command="b")])
