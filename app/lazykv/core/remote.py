"""Remote backends: llama.cpp RPC servers (``ggml-rpc-server``) given as ``host:port`` (Qt-free, engine-free).

llama.cpp's RPC client aborts the whole process when a server it uses never answers, so every
endpoint is checked here first: parsed (what llama.cpp's own parser and IPv4 resolver accept), then
probed with a plain TCP connection and a short timeout; only the ones that answer go to the engine.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PROBE_TIMEOUT_S = 1.5  # a server on the local network answers a TCP connect in milliseconds
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
        raise ValueError(f"“{entry}”: llama.cpp's RPC client does not take IPv6 addresses; use an IPv4 "
                         "address or a host name")
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


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if a TCP connection to ``endpoint`` opens within ``timeout`` seconds, else why not."""
    ep = parse_endpoint(endpoint)
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"the host name “{ep.host}” is unknown"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except ConnectionRefusedError:
        return "nothing is listening on that port (connection refused)"
    except OSError as err:
        return err.strerror or str(err)


def probe_all(
    endpoints: Sequence[str], timeout: float = PROBE_TIMEOUT_S
) -> tuple[list[str], list[Unreachable]]:
    """(the endpoints that answered, the others with the reason), each list in the given order.

    Probed in parallel, so the whole check takes at most about ``timeout``."""
    if not endpoints:
        return [], []
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints)), thread_name_prefix="rpc-probe") as pool:
        reasons = list(pool.map(lambda ep: probe(ep, timeout), endpoints))
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
    "Each remote backend (a llama.cpp RPC server, ggml-rpc-server) is checked with a TCP connection "
    "before the model loads: llama.cpp stops the whole app when a server it uses does not answer, so a "
    "server that does not answer is left out and the model loads on the others and this computer. "
    "Start ggml-rpc-server on that machine (ggml-rpc-server -H 0.0.0.0 -p PORT) or change the list in "
    "Settings; changing it reloads the model."
)
