"""The MCP servers the app starts, in the shape Claude Desktop and LM Studio use for ``mcp.json``.

```json
{"mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
    "web": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer …"}},
    "off": {"command": "uvx", "args": ["mcp-server-time"], "disabled": true}}}
```

A server is started by a command over stdio (``command``, ``args``, ``env``, ``cwd``) or reached at a
streamable-HTTP ``url`` (``headers``). ``disabled: true`` (as Cline writes it) or ``enabled: false``
keeps one configured but not started. The app's own list is ``paths.mcp_file()`` in the same shape;
an ``mcp.json`` from elsewhere is merged into it by server name (``import_mcp_json``). Bad input raises
``McpConfigError`` with a sentence naming the server and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lazykv.core.files import write_text_atomic
from lazykv.core.paths import mcp_file, restrict

# the "type" values other apps write for each transport; "sse" (the older HTTP transport) is refused
STDIO_TYPES = ("stdio",)
HTTP_TYPES = ("http", "streamable-http", "streamableHttp", "streamable_http")

_EMPTY: Mapping[str, str] = MappingProxyType({})


class McpConfigError(ValueError):
    """An ``mcp.json`` (or a server entered by hand) the app cannot use; the message is a sentence."""


@dataclass(frozen=True)
class McpServerConfig:
    """One entry of ``mcpServers``: a command run over stdio, or a streamable-HTTP URL."""

    name: str
    command: str = ""  # stdio
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    cwd: str | None = None
    url: str = ""  # streamable HTTP
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    enabled: bool = True

    def __post_init__(self) -> None:
        # read-only copies, so that a frozen config stays frozen and compares by value
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        check_server(self)

    def __hash__(self) -> int:
        return hash((self.name, self.command, self.args, tuple(sorted(self.env.items())), self.cwd,
                     self.url, tuple(sorted(self.headers.items())), self.enabled))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, McpServerConfig):
            return NotImplemented
        return _key(self) == _key(other)

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "http" if self.url else "stdio"

    def describe(self) -> str:
        """The command line or the URL, as the Settings page shows it."""
        if self.url:
            return self.url
        return " ".join([self.command, *self.args])

    def to_json(self) -> dict[str, Any]:
        """The entry as ``mcpServers`` holds it (without the name, its key)."""
        entry: dict[str, Any] = {}
        if self.url:
            entry["url"] = self.url
            if self.headers:
                entry["headers"] = dict(self.headers)
        else:
            entry["command"] = self.command
            if self.args:
                entry["args"] = list(self.args)
            if self.env:
                entry["env"] = dict(self.env)
            if self.cwd:
                entry["cwd"] = self.cwd
        if not self.enabled:
            entry["disabled"] = True
        return entry


def _key(c: McpServerConfig) -> tuple[Any, ...]:
    return (c.name, c.command, c.args, dict(c.env), c.cwd, c.url, dict(c.headers), c.enabled)


def check_server(config: McpServerConfig) -> None:
    """Raise McpConfigError unless ``config`` names a server and exactly one way to reach it."""
    if not config.name.strip():
        raise McpConfigError("An MCP server needs a name.")
    if config.url and config.command:
        raise McpConfigError(f"The MCP server \u201c{config.name}\u201d has both a command and a URL; "
                             "give one of them.")
    if not config.url and not config.command.strip():
        raise McpConfigError(f"The MCP server \u201c{config.name}\u201d needs a command to run or a URL.")
    if config.url and not config.url.startswith(("http://", "https://")):
        raise McpConfigError(f"The MCP server \u201c{config.name}\u201d has the URL "
                             f"\u201c{config.url}\u201d, which does not start with http:// or https://.")


def _strings(name: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"The MCP server \u201c{name}\u201d: \u201c{key}\u201d should be a list of "
                             "strings.")
    return tuple(value)


def _string_map(name: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"The MCP server \u201c{name}\u201d: \u201c{key}\u201d should be an object of "
                             "strings, e.g. {\"API_KEY\": \"…\"}.")
    return {str(k): v for k, v in value.items()}


def _string(name: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise McpConfigError(f"The MCP server \u201c{name}\u201d: \u201c{key}\u201d should be a string.")
    return value


def _server(name: str, entry: Any) -> McpServerConfig:
    if not isinstance(entry, dict):
        raise McpConfigError(f"The MCP server \u201c{name}\u201d should be an object with a "
                             "\u201ccommand\u201d or a \u201curl\u201d.")
    kind = entry.get("type", entry.get("transport", ""))
    if kind == "sse" or (kind and kind not in STDIO_TYPES + HTTP_TYPES):
        raise McpConfigError(f"The MCP server \u201c{name}\u201d uses the \u201c{kind}\u201d transport; the "
                             "app speaks stdio and streamable HTTP.")
    enabled = True
    if "disabled" in entry:
        if not isinstance(entry["disabled"], bool):
            raise McpConfigError(f"The MCP server \u201c{name}\u201d: \u201cdisabled\u201d should be true or "
                                 "false.")
        enabled = not entry["disabled"]
    if "enabled" in entry:
        if not isinstance(entry["enabled"], bool):
            raise McpConfigError(f"The MCP server \u201c{name}\u201d: \u201cenabled\u201d should be true or "
                                 "false.")
        enabled = enabled and entry["enabled"]
    cwd = entry.get("cwd")
    return McpServerConfig(
        name=name,
        command=_string(name, "command", entry.get("command", "")),
        args=_strings(name, "args", entry.get("args", [])),
        env=_string_map(name, "env", entry.get("env", {})),
        cwd=None if cwd is None else _string(name, "cwd", cwd) or None,
        url=_string(name, "url", entry.get("url", entry.get("serverUrl", ""))),
        headers=_string_map(name, "headers", entry.get("headers", {})),
        enabled=enabled,
    )


def parse_mcp_json(text: str) -> list[McpServerConfig]:
    """The servers of an ``mcp.json`` text (``{"mcpServers": {name: entry}}``), in its order."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"This is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}).") from e
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError("An mcp.json holds an object with \u201cmcpServers\u201d: "
                             "{\"name\": {\"command\": …} or {\"url\": …}}; this one has no such object.")
    return [_server(str(name), entry) for name, entry in data["mcpServers"].items()]


def dump_mcp_json(servers: Iterable[McpServerConfig]) -> str:
    """``servers`` as an ``mcp.json`` text (parse_mcp_json reads it back)."""
    return json.dumps({"mcpServers": {s.name: s.to_json() for s in servers}}, indent=2) + "\n"


def load_servers(path: Path | None = None) -> list[McpServerConfig]:
    """The app's servers (``paths.mcp_file()`` unless ``path``); none when the file does not exist yet.
    A damaged file raises McpConfigError naming it."""
    path = path or mcp_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise McpConfigError(f"The MCP servers' file {path} could not be read ({e}).") from e
    try:
        return parse_mcp_json(text)
    except McpConfigError as e:
        raise McpConfigError(f"The MCP servers' file {path}: {e}") from e


def save_servers(servers: Iterable[McpServerConfig], path: Path | None = None) -> None:
    """Write the app's servers atomically, owner-only (an ``env`` or a header may hold a key)."""
    servers = list(servers)
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise McpConfigError("Two MCP servers have the same name; each needs its own.")
    path = path or mcp_file()
    write_text_atomic(path, dump_mcp_json(servers))
    restrict(path)


def merge_servers(saved: Iterable[McpServerConfig], new: Iterable[McpServerConfig]) -> list[McpServerConfig]:
    """``saved`` with each of ``new`` replacing the one of its name, or appended."""
    merged = {s.name: s for s in saved}
    for server in new:
        merged[server.name] = server
    return list(merged.values())


def import_mcp_json(path: Path | str, saved_path: Path | None = None) -> list[McpServerConfig]:
    """Merge the servers of the ``mcp.json`` at ``path`` into the saved list by name, save it, return it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise McpConfigError(f"{path} could not be read ({e}).") from e
    try:
        new = parse_mcp_json(text)
    except McpConfigError as e:
        raise McpConfigError(f"{path.name}: {e}") from e
    servers = merge_servers(load_servers(saved_path), new)
    save_servers(servers, saved_path)
    return servers
