"""The MCP servers, connected with the official ``mcp`` SDK on the hub's own asyncio thread.

```
 McpHub.start ─> thread "mcp-hub": asyncio loop ─> one task per enabled server:
     stdio_client(command) or streamable_http_client(url) ─> ClientSession ─> initialize, tools/list
     ─> READY, then a ping every PING_INTERVAL_S (at once when its stderr closes: the process ended)
 McpHub.call (a worker thread, never the GUI's) ─run_coroutine_threadsafe─> session.call_tool
     ─> waits in POLL_S slices for the answer, the caller's cancel event or the timeout
```

Nothing here raises at the caller for a server's trouble: a server that cannot start is FAILED with a
sentence and its stderr's tail; a call to a dead, hanging or flooding server gives a ``ToolResult``
with ``is_error`` (only an unknown tool name is a ``KeyError``). A tool's output is text for the model:
the hub never executes or opens it, and cuts it at the output cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from lazykv.core.tools.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0  # a server's start, up to its list of tools (npx may fetch a package first)
PING_INTERVAL_S = 15.0  # how often a READY server is asked whether it is still there
PING_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 8.0  # close(): the SDK closes stdin, waits 2 s, SIGTERMs, waits 2 s, SIGKILLs
POLL_S = 0.05  # how often a waiting call looks at its cancel event
STDERR_TAIL_CHARS = 16_384  # the stderr kept per server, shown on demand
LINE_CAP = Path(__file__).with_name("line_cap.py")  # a stdio server runs under it (its messages held short)
HTTP_TIMEOUT_S = 30.0
QUALIFIED_MAX = 64
_QUALIFIED_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_QUALIFIED_BAD = re.compile(r"[^a-zA-Z0-9_-]")


def qualify(server: str, name: str, *, hashed: bool = False) -> str:
    """``server__name`` as a function name every OpenAI-style client takes (``^[a-zA-Z0-9_-]{1,64}$``);
    a name that had to change (or ``hashed``) ends in a short hash of the pair, so two never meet."""
    plain = f"{server}__{name}"
    clean = _QUALIFIED_BAD.sub("_", plain)
    if not hashed and clean == plain and len(clean) <= QUALIFIED_MAX:
        return clean
    digest = hashlib.sha256(f"{server}\0{name}".encode()).hexdigest()[:8]
    return f"{clean[:QUALIFIED_MAX - 9]}_{digest}"


@dataclass(frozen=True)
class ToolSpec:
    """A tool one server offers, as the model is told of it."""

    server: str
    name: str
    description: str
    input_schema: dict = field(hash=False)
    alias: str = field(default="", compare=False)  # the qualified name the hub gave it when two met

    @property
    def qualified(self) -> str:
        """The name the model calls it by: ``server__name``, sanitized, unique in its hub."""
        return self.alias or qualify(self.server, self.name)

    def openai_tool(self) -> dict:
        """The tool as OpenAI's ``tools`` list (and a chat template) takes it."""
        schema = self.input_schema or {"type": "object", "properties": {}}
        return {"type": "function", "function": {
            "name": self.qualified, "description": self.description, "parameters": schema}}


@dataclass(frozen=True)
class ToolResult:
    text: str  # the tool's output as plain text (text content joined; other content described)
    is_error: bool
    truncated: bool  # cut at the output cap

    def for_model(self) -> str:
        """The text with a last line saying it was cut, when it was."""
        if not self.truncated:
            return self.text
        return f"{self.text}\n[The output was cut here: it was longer than the tool output cap.]"


class ServerState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True)
class ServerStatus:
    state: ServerState
    message: str  # a sentence: what the server is doing, or why it failed
    stderr: str  # its stderr's tail (STDERR_TAIL_CHARS at most), shown on demand


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """``text`` cut to at most ``cap`` bytes of UTF-8 (never inside a character), and whether it was."""
    data = text.encode("utf-8", "replace")
    if len(data) <= cap:
        return text, False
    return data[:max(0, cap)].decode("utf-8", "ignore"), True


def result_text(result: types.CallToolResult) -> str:
    """A tool's result as plain text: its text joined; other content named, never opened."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent):
            parts.append(f"[image: {block.mime_type}]")
        elif isinstance(block, types.AudioContent):
            parts.append(f"[audio: {block.mime_type}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            parts.append(res.text if isinstance(res, types.TextResourceContents)
                         else f"[resource: {res.uri}, {res.mime_type or 'binary'}]")
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class _StderrTail:
    """A stdio server's stderr: a pipe read by a thread into a bounded tail; ``on_end`` at EOF."""

    def __init__(self, on_end: Callable[[], None]) -> None:
        self._chunks: deque[str] = deque()
        self._size = 0
        self._lock = threading.Lock()
        read_fd, write_fd = os.pipe()
        self.writer: IO[bytes] | None = os.fdopen(write_fd, "wb")
        self._reader = os.fdopen(read_fd, "rb", buffering=0)
        self._on_end = on_end
        threading.Thread(target=self._read, name="mcp-stderr", daemon=True).start()

    def spawned(self) -> None:
        """The process holds its own copy of the pipe now: our end goes, so its exit ends the read."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def text(self) -> str:
        with self._lock:
            return "".join(self._chunks)

    def _read(self) -> None:
        try:
            while chunk := self._reader.read(4096):
                self._add(chunk.decode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            self._reader.close()
            self._on_end()

    def _add(self, text: str) -> None:
        with self._lock:
            self._chunks.append(text)
            self._size += len(text)
            while self._size > STDERR_TAIL_CHARS and len(self._chunks) > 1:
                self._size -= len(self._chunks.popleft())
            if self._size > STDERR_TAIL_CHARS:
                self._chunks[0] = self._chunks[0][-STDERR_TAIL_CHARS:]
                self._size = len(self._chunks[0])


@dataclass(eq=False)
class _Server:
    """One run of one server (a changed config starts a new one; a stale run's news is ignored)."""

    config: McpServerConfig
    state: ServerState = ServerState.STARTING
    message: str = "Starting\u2026"
    tools: list[ToolSpec] = field(default_factory=list)
    stderr: _StderrTail | None = None
    session: ClientSession | None = None
    task: asyncio.Task | None = None
    wake: asyncio.Event | None = None
    relist: bool = False

    def status(self) -> ServerStatus:
        return ServerStatus(self.state, self.message, self.stderr.text() if self.stderr else "")


class _Stopped(Exception):
    """A READY server stopped answering; the message is the sentence."""


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


def _failure(config: McpServerConfig, error: BaseException, connect_timeout: float) -> str:
    """The sentence for a server that could not start or stopped."""
    leaves = _leaves(error)
    e = next((x for x in leaves if not isinstance(x, anyio.get_cancelled_exc_class())), leaves[0])
    if isinstance(e, _Stopped):
        return str(e)
    if isinstance(e, FileNotFoundError) and not config.url:
        return (f"The command \u201c{config.command}\u201d was not found: check that it is installed "
                "and on the PATH, or give its full path.")
    if isinstance(e, PermissionError) and not config.url:
        return f"The command \u201c{config.command}\u201d could not be run (permission denied)."
    if isinstance(e, TimeoutError):
        return f"The server did not get ready within {connect_timeout:g} s of starting."
    if isinstance(e, httpx2.HTTPError):
        return f"The server at {config.url} could not be reached ({type(e).__name__}: {e})."
    if not config.url:
        return (f"The server ended before it was ready ({type(e).__name__}: {e}); its error output "
                "may say why.")
    return f"The server at {config.url} did not connect ({type(e).__name__}: {e})."


class McpHub:
    """The configured MCP servers and their tools; see the module's docstring."""

    def __init__(self, servers: Sequence[McpServerConfig], timeout_s: float, output_cap: int,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """``timeout_s``: a call's time limit; ``output_cap``: the most bytes of output the model reads."""
        self._lock = threading.RLock()
        self._configs: list[McpServerConfig] = []
        self._servers: dict[str, _Server] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.timeout_s = float(timeout_s)
        self.output_cap = int(output_cap)
        self.connect_timeout_s = float(connect_timeout_s)
        self._set_configs(servers)

    # --- the caller's side (any thread) ---

    def start(self) -> None:
        """Connect the enabled servers on the hub's own thread; returns at once."""
        with self._lock:
            if self._loop is not None or self._closed:
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._thread = threading.Thread(target=self._thread_main, args=(loop,), name="mcp-hub",
                                            daemon=True)
            self._thread.start()
            for config in self._configs:
                if config.enabled:
                    self._launch(config)
        self._changed()

    def close(self) -> None:
        """Stop every server within about CLOSE_TIMEOUT_S (the SDK kills a stdio one that ignores its
        stdin closing), then the hub's thread. The hub cannot be started again."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            servers = list(self._servers.values())
            self._servers.clear()
            self._specs = {}
        if loop is None or thread is None:
            return
        tasks = [s.task for s in servers if s.task is not None]

        async def stop_all() -> None:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(CLOSE_TIMEOUT_S + 1)
        except (TimeoutError, RuntimeError) as e:
            log.warning("MCP servers did not all stop in time: %s", e)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(2.0)

    def set_servers(self, servers: Sequence[McpServerConfig]) -> None:
        """Reconfigure live: removed or changed servers stop, new or changed enabled ones start."""
        with self._lock:
            old = {c.name: c for c in self._configs}
            self._set_configs(servers)
            for name, server in list(self._servers.items()):
                config = next((c for c in self._configs if c.name == name), None)
                if config is None or config != old.get(name) or not config.enabled:
                    self._stop(server)
                    del self._servers[name]
            if self._loop is not None and not self._closed:
                for config in self._configs:
                    if config.enabled and config.name not in self._servers:
                        self._launch(config)
            self._rebuild_specs()
        self._changed()

    def set_limits(self, timeout_s: float, output_cap: int) -> None:
        """New calls use these (the Settings' tool timeout and output cap)."""
        self.timeout_s, self.output_cap = float(timeout_s), int(output_cap)

    def servers(self) -> list[McpServerConfig]:
        with self._lock:
            return list(self._configs)

    def tools(self) -> list[ToolSpec]:
        """The tools of the READY servers, in the servers' order, each with a unique qualified name."""
        with self._lock:
            return list(self._specs.values())

    def find(self, qualified: str) -> ToolSpec | None:
        with self._lock:
            return self._specs.get(qualified)

    def server_tools(self, name: str) -> list[ToolSpec]:
        """One server's tools (none unless it is READY)."""
        with self._lock:
            return [s for s in self._specs.values() if s.server == name]

    def status(self) -> dict[str, ServerStatus]:
        """Every configured server's state, in the configuration's order."""
        with self._lock:
            out = {}
            for config in self._configs:
                server = self._servers.get(config.name)
                if not config.enabled:
                    out[config.name] = ServerStatus(ServerState.DISABLED, "Disabled.", "")
                elif server is None:
                    out[config.name] = ServerStatus(ServerState.STARTING, "Not started yet.", "")
                else:
                    out[config.name] = server.status()
            return out

    def on_change(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on any thread) whenever a server's state or the tools change."""
        with self._lock:
            self._listeners.append(fn)

    def off_change(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn`` (e.g. a page being closed)."""
        with self._lock:
            with contextlib.suppress(ValueError):
                self._listeners.remove(fn)

    def call(self, qualified: str, arguments: dict, cancel: threading.Event) -> ToolResult:
        """Run a tool and wait for its result (from a worker thread, never the GUI's): within the
        timeout, or until ``cancel`` is set; a KeyError for an unknown tool, else never raises."""
        with self._lock:
            spec = self._specs.get(qualified)
            if spec is None:
                raise KeyError(qualified)
            server = self._servers.get(spec.server)
            loop = self._loop
            timeout, cap = self.timeout_s, self.output_cap
        if server is None or server.session is None or server.state is not ServerState.READY or loop is None:
            message = server.message if server is not None else "It is not running."
            return ToolResult(f"The tool server \u201c{spec.server}\u201d is not available: {message}", True,
                              False)
        coro = self._call(server, server.session, spec, arguments, timeout, cap)
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the hub closed meanwhile
            coro.close()
            return ToolResult(f"The tool server \u201c{spec.server}\u201d was stopped.", True, False)
        deadline = time.monotonic() + timeout + 2.0  # the loop's own timeout answers first
        while True:
            try:
                return future.result(POLL_S)
            except TimeoutError:
                if cancel.is_set():
                    future.cancel()
                    return ToolResult("Cancelled", True, False)
                if time.monotonic() > deadline:
                    future.cancel()
                    return ToolResult(_timeout_text(timeout), True, False)
            except Exception as e:  # a cancelled future (close() while waiting), or the unforeseen
                return ToolResult(f"The call to {spec.name} failed ({type(e).__name__}: {e}).", True, False)

    # --- the hub's thread ---

    def _thread_main(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait(pending, timeout=2.0) if pending else asyncio.sleep(0))
            loop.close()

    def _launch(self, config: McpServerConfig) -> None:
        """Start a run of ``config`` (the lock held, the loop running)."""
        assert self._loop is not None
        server = _Server(config)
        self._servers[config.name] = server

        def begin() -> None:
            server.wake = asyncio.Event()
            server.task = asyncio.ensure_future(self._run(server))

        self._loop.call_soon_threadsafe(begin)

    def _stop(self, server: _Server) -> None:
        loop = self._loop
        if loop is None:
            return

        def cancel() -> None:
            if server.task is not None:
                server.task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(cancel)

    def _poke(self, server: _Server) -> None:
        """Have the run check its server now (from any thread)."""
        loop = self._loop
        if loop is not None and server.wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(server.wake.set)

    async def _run(self, server: _Server) -> None:
        config = server.config
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(server))

                async def on_message(message: Any) -> None:
                    if isinstance(message, types.ToolListChangedNotification):
                        server.relist = True
                        if server.wake is not None:
                            server.wake.set()

                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=on_message))
                with anyio.fail_after(self.connect_timeout_s):
                    await session.initialize()
                    tools = await _list_tools(session)
                server.session = session
                self._update(server, ServerState.READY, _ready_text(tools), tools)
                await self._watch(server, session)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a server's trouble is its state, never the hub's
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            log.info("MCP server %s: %r", config.name, e)
            server.session = None
            self._update(server, ServerState.FAILED, _failure(config, e, self.connect_timeout_s), [])

    @contextlib.asynccontextmanager
    async def _transport(self, server: _Server) -> AsyncIterator[Any]:
        config = server.config
        if config.url:
            timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=max(HTTP_TIMEOUT_S, self.timeout_s + 5))
            async with httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout) as client:
                async with streamable_http_client(config.url, http_client=client) as streams:
                    yield streams
            return
        tail = _StderrTail(lambda: self._poke(server))
        server.stderr = tail
        # through line_cap, a process of its own: the SDK never parses a flood in the app's process
        path = os.pathsep.join(filter(None, [config.env.get("PATH", ""), os.environ.get("PATH", "")]))
        if shutil.which(config.command, path=path) is None and not os.path.isfile(config.command):
            raise FileNotFoundError(config.command)
        capped = [str(LINE_CAP), str(self.output_cap), "--", config.command, *config.args]
        params = StdioServerParameters(command=sys.executable, args=capped, env=dict(config.env),
                                       cwd=config.cwd)
        try:
            async with stdio_client(params, errlog=tail.writer) as streams:  # type: ignore[arg-type]
                tail.spawned()
                yield streams
        finally:
            tail.spawned()

    async def _watch(self, server: _Server, session: ClientSession) -> None:
        """Until cancelled: ping the server now and then, and when woken (its stderr closed, a call
        failed, its tools changed); a server that does not answer raises _Stopped."""
        assert server.wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wake.wait(), PING_INTERVAL_S)
            server.wake.clear()
            try:
                with anyio.fail_after(PING_TIMEOUT_S):
                    await session.send_ping()
                    if server.relist:
                        server.relist = False
                        tools = await _list_tools(session)
                        self._update(server, ServerState.READY, _ready_text(tools), tools)
            except TimeoutError as e:
                raise _Stopped(f"The server stopped answering (no answer within {PING_TIMEOUT_S:g} s)."
                               ) from e
            except Exception as e:
                raise _Stopped(f"The server stopped ({type(e).__name__}: {e}).") from e

    async def _call(self, server: _Server, session: ClientSession, spec: ToolSpec, arguments: dict,
                    timeout: float, cap: int) -> ToolResult:
        try:
            with anyio.fail_after(timeout):
                result = await session.call_tool(spec.name, arguments)
        except TimeoutError:
            return ToolResult(_timeout_text(timeout), True, False)
        except Exception as e:  # the server died or answered with a protocol error
            self._poke(server)
            return ToolResult(f"The tool server \u201c{spec.server}\u201d could not run {spec.name} "
                              f"({type(e).__name__}: {e}).", True, False)
        if not isinstance(result, types.CallToolResult):
            return ToolResult(f"The tool server \u201c{spec.server}\u201d answered {spec.name} with "
                              "something other than a result.", True, False)
        text, truncated = cap_text(result_text(result), cap)
        return ToolResult(text, bool(result.is_error), truncated)

    # --- shared ---

    def _set_configs(self, servers: Sequence[McpServerConfig]) -> None:
        configs = list(servers)
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ValueError("Two MCP servers have the same name; each needs its own.")
        self._configs = configs

    def _update(self, server: _Server, state: ServerState, message: str, tools: list[types.Tool]) -> None:
        with self._lock:
            if self._servers.get(server.config.name) is not server:
                return  # a stale run (removed, changed or closed)
            server.state, server.message = state, message
            server.tools = [ToolSpec(server.config.name, t.name, t.description or "",
                                     dict(t.input_schema or {})) for t in tools]
            self._rebuild_specs()
        self._changed()

    def _rebuild_specs(self) -> None:
        """The READY servers' tools by qualified name; a name met twice gets its hashed form."""
        specs: dict[str, ToolSpec] = {}
        for config in self._configs:
            server = self._servers.get(config.name)
            if server is None or server.state is not ServerState.READY:
                continue
            for spec in server.tools:
                if spec.qualified in specs:
                    spec = replace(spec, alias=qualify(spec.server, spec.name, hashed=True))
                specs[spec.qualified] = spec
        self._specs = specs

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn()
            except Exception:
                log.exception("an MCP hub listener failed")


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            return tools


def _ready_text(tools: list[types.Tool]) -> str:
    return f"Ready: {len(tools)} tool{'' if len(tools) == 1 else 's'}."


def _timeout_text(timeout: float) -> str:
    return f"The tool did not answer within {timeout:g} s."
