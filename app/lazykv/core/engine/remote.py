"""Remote backends: llama.cpp RPC servers (``ggml-rpc-server``) given as ``host:port`` (Qt-free, engine-free).

llama.cpp's RPC client aborts the whole process when a server it uses does not answer or answers
something else, and waits forever on one that accepts but stays silent, so every endpoint is checked
here first: parsed (what llama.cpp's own parser and IPv4 resolver accept), then probed with a short
timeout: a TCP connection, and for a server this process does not use yet, llama.cpp's own HELLO
handshake (the version of the protocol). Only the ones that pass go to the engine.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import struct
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PROBE_TIMEOUT_S = 1.5  # a server on the local network answers a TCP connect in milliseconds
# ggml-rpc of the pinned engine: RPC_CMD_HELLO (fixed at 14 across versions), its request (the
# connection capabilities, zeros: plain TCP) and reply (major, minor, patch, padding, capabilities)
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_VERSION = (7, 0)  # ggml-rpc.h: the major must match, the server's minor may not be newer
_HELLO = bytes([RPC_CMD_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
_HELLO_REPLY = 4 + RPC_CONN_CAPS_SIZE
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` as llama.cpp's RPC client reads it, else ValueError with a sentence saying why not."""
    entry = text.strip()
    host, sep, port = entry.rpartition(":")
    if not sep or not host:
        raise ValueError(f"“{entry}” is not host:port (for example 192.168.1.20:50052)")
    if host.startswith("[") or ":" in host:
        raise ValueError(f"“{entry}”: llama.cpp's RPC client takes no IPv6; use IPv4 or a host name")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"“{entry}”: the port must be a number from 1 to 65535")
    if not _valid_host(host):
        raise ValueError(f"“{entry}”: “{host}” is not a valid host name or IPv4 address")
    return Endpoint(host.lower(), int(port))


def _valid_host(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        pass
    if host.replace(".", "").isdigit():  # all digits but not an address: 300.1.1.1, 10.1
        return False
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def normalize_endpoints(entries: Iterable[str]) -> list[str]:
    """Each entry parsed and written the one way, duplicates removed (first kept); ValueError on a bad one."""
    seen: dict[str, None] = {}
    for entry in entries:
        seen.setdefault(str(parse_endpoint(entry)), None)
    return list(seen)


@dataclass(frozen=True)
class ParsedText:
    """What the user typed into the endpoint list: the valid endpoints, and a sentence per bad entry."""

    endpoints: list[str]
    problems: list[str]


def parse_endpoint_text(text: str) -> ParsedText:
    """Entries separated by new lines, commas or spaces; empty ones ignored, duplicates removed."""
    endpoints: dict[str, None] = {}
    problems: list[str] = []
    for entry in re.split(r"[\s,]+", text):
        if not entry:
            continue
        try:
            endpoints.setdefault(str(parse_endpoint(entry)), None)
        except ValueError as err:
            problems.append(str(err))
    return ParsedText(list(endpoints), problems)


@dataclass(frozen=True)
class Unreachable:
    """An endpoint left out of the engine, and why, in words."""

    endpoint: str
    reason: str


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S, handshake: bool = True) -> str | None:
    """None if ``endpoint`` accepts a TCP connection (and, with ``handshake``, answers llama.cpp's RPC
    HELLO with a protocol version the engine speaks) within ``timeout`` seconds, else why not.

    No handshake with a server this process already uses: it serves one client at a time (this
    process), so the probe's HELLO would wait behind it."""
    ep = parse_endpoint(endpoint)
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout) as sock:
            return _hello(sock, timeout) if handshake else None
    except socket.gaierror:
        return f"the host name “{ep.host}” is unknown"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except ConnectionRefusedError:
        return "nothing is listening on that port (connection refused)"
    except OSError as err:
        return err.strerror or str(err)


def _hello(sock: socket.socket, timeout: float) -> str | None:
    try:
        sock.sendall(_HELLO)
        reply = _receive(sock, 8 + _HELLO_REPLY)
    except TimeoutError:
        _answer_later(sock)
        return (f"it accepted the connection but did not answer llama.cpp's handshake within {timeout:g} s: "
                "it serves another client, or it is not a llama.cpp RPC server")
    except ConnectionError:  # reset: it closed with our handshake unread
        reply = None
    if reply is None:
        return "it closed the connection at llama.cpp's handshake: not a llama.cpp RPC server of this version"
    (size,) = struct.unpack_from("<Q", reply)
    if size != _HELLO_REPLY:
        return "it answered, but not as a llama.cpp RPC server"
    major, minor, patch = reply[8:11]
    if major != RPC_PROTO_VERSION[0] or minor > RPC_PROTO_VERSION[1]:
        return (f"it speaks llama.cpp RPC protocol {major}.{minor}.{patch}, this app's engine "
                f"{RPC_PROTO_VERSION[0]}.{RPC_PROTO_VERSION[1]}: update one of them")
    return None


def _answer_later(sock: socket.socket) -> None:
    """Keep the connection of an unanswered handshake open until the server answers it.

    A busy ggml-rpc-server reads the HELLO once its current client leaves; if the probe had closed the
    connection by then, its reply would hit a closed socket and SIGPIPE would end the server."""
    kept = sock.dup()  # the caller closes ``sock``; the connection stays open through this one
    kept.settimeout(None)

    def wait() -> None:
        with kept, contextlib.suppress(OSError):
            _receive(kept, 8 + _HELLO_REPLY)

    threading.Thread(target=wait, name="rpc-probe-linger", daemon=True).start()


def _receive(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None if the peer closed the connection first."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def probe_all(
    endpoints: Sequence[str], timeout: float = PROBE_TIMEOUT_S, in_use: frozenset[str] = frozenset()
) -> tuple[list[str], list[Unreachable]]:
    """(the endpoints that passed, the others with the reason), each list in the given order.

    ``in_use``: endpoints this process already uses (probed without the handshake, see ``probe``).
    Probed in parallel, so the whole check takes at most about twice ``timeout``."""
    if not endpoints:
        return [], []
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints)), thread_name_prefix="rpc-probe") as pool:
        reasons = list(pool.map(lambda ep: probe(ep, timeout, handshake=ep not in in_use), endpoints))
    reachable = [ep for ep, reason in zip(endpoints, reasons, strict=True) if reason is None]
    refused = [Unreachable(ep, reason) for ep, reason in zip(endpoints, reasons, strict=True) if reason]
    return reachable, refused


def unreachable_text(refused: Sequence[Unreachable]) -> str:
    """One sentence for the user: which remote backends were left out, and why."""
    if len(refused) == 1:
        return (f"The remote backend {refused[0].endpoint} could not be used ({refused[0].reason}), so the "
                "model runs without it.")
    listed = "; ".join(f"{r.endpoint} ({r.reason})" for r in refused)
    return f"{len(refused)} remote backends could not be used, so the model runs without them: {listed}."


UNREACHABLE_DETAILS = (
    "Each remote backend (a llama.cpp RPC server, ggml-rpc-server) is checked before the model loads: a "
    "TCP connection and llama.cpp's handshake. llama.cpp stops the whole app when a server it uses does "
    "not answer as one, so such a server is left out and the model loads on the others and this computer. "
    "Start ggml-rpc-server on that machine (ggml-rpc-server -H 0.0.0.0 -p PORT) or change the list in "
    "Settings; changing it reloads the model."
)
