"""Run a stdio MCP server with its messages to the app held to a size: ``python line_cap.py LIMIT --
COMMAND ARGS...`` (standard library only: the hub starts it by its path, in the environment the MCP SDK
gives a server).

The SDK parses each message the server writes (a line of JSON-RPC) in the app's process, holding Python's
lock while it does: a tool that answers 5 MB would stop the window for about 100 ms. Here, in a process
of its own, a line much longer than ``LIMIT`` bytes is parsed instead: a tool result's text is cut to
``LIMIT`` bytes and one (so the hub still sees, and says, that it was cut), any other message too long
becomes a JSON-RPC error for its request. The server gets the app's stdin as it is, and its stderr goes
where this one's does; it ends with this process (``PR_SET_PDEATHSIG`` on Linux) and this one with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys
from typing import Any

TOO_LONG = "The MCP server's message was longer than {limit} bytes; it was not read."
SLACK = 64 * 1024  # a message's JSON around its text: lines up to the cap and this pass as they are


def shrink(line: bytes, limit: int) -> bytes:
    """``line`` (a JSON-RPC message and its newline) as the app may read it: a tool result's text at most
    ``limit`` bytes and one, no message much longer."""
    if len(line) <= limit + SLACK:
        return line
    try:
        message = json.loads(line)
    except ValueError:
        return b""  # not JSON-RPC: the SDK would drop it too
    if not isinstance(message, dict):
        return b""
    result = message.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        budget = limit + 1
        content: list[Any] = []
        for block in result["content"]:
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                data = block["text"].encode("utf-8")[:max(0, budget)]
                budget -= len(data)
                content.append({**block, "text": data.decode("utf-8", "ignore")})
            elif budget > 0:
                kind = block.get("type", "content") if isinstance(block, dict) else "content"
                content.append({"type": "text", "text": f"[{kind} left out: the output was too long]"})
        if "structuredContent" in result:  # its shape kept: the client checks it against the tool's schema
            result = {**result, "structuredContent": _cut_strings(result["structuredContent"], limit + 1)}
        message = {**message, "result": {**result, "content": content}}
    elif "id" in message:
        message = {"jsonrpc": "2.0", "id": message["id"],
                   "error": {"code": -32000, "message": TOO_LONG.format(limit=limit)}}
    else:
        return b""  # a notification too long to read: dropped
    return json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"


def _cut_strings(value: Any, limit: int) -> Any:
    """``value`` with every string cut to ``limit`` bytes (its shape kept)."""
    if isinstance(value, str):
        return value.encode("utf-8")[:limit].decode("utf-8", "ignore")
    if isinstance(value, list):
        return [_cut_strings(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: _cut_strings(v, limit) for k, v in value.items()}
    return value


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: line_cap.py LIMIT -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    limit = int(argv[0])
    try:
        child = subprocess.Popen(argv[2:], stdout=subprocess.PIPE,
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except OSError as err:
        print(f"could not start {argv[2]}: {err}", file=sys.stderr)
        return 127
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    assert child.stdout is not None
    out = sys.stdout.buffer
    for line in child.stdout:
        data = shrink(line, limit)
        if data:
            out.write(data)
            out.flush()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
