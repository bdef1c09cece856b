"""What a local API server is started with, checked once before anything listens.

Safe by default: it binds to the loopback interface; any other address needs an API key; CORS is off
unless origins are named; request bodies, ``max_tokens`` and the queue are bounded.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


class InsecureBindError(ValueError):
    """A non-loopback address without an API key."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = DEFAULT_HOST
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)  # 0: an ephemeral port (tests)
    api_key: str | None = Field(None, repr=False)  # never in a repr, a log or a traceback
    cors_origins: tuple[str, ...] = ()  # () : no CORS headers at all
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    max_tokens_cap: int = Field(4096, ge=1)  # a request asking for more gets this many at most
    default_max_tokens: int = Field(1024, ge=1)  # when a request names no limit
    queue_size: int = Field(8, ge=1)  # requests running or waiting; one more is answered 429
    max_messages: int = Field(4096, ge=1)
    cache_dir: Path | None = None  # None: no snapshots kept across restarts
    cache_budget_bytes: int = Field(2 * 1024**3, ge=0)  # the "API cache" on disk; LRU past it
    cache_min_tokens: int = Field(64, ge=1)  # shorter caches are not worth a file

    @model_validator(mode="after")
    def _key_for_the_network(self) -> ServerSettings:
        if not is_loopback(self.host) and not self.api_key:
            raise InsecureBindError(
                f"listening on {self.host} lets other machines use the model: give an API key "
                "(--api-key KEY or LAZYKV_API_KEY), or keep the default host 127.0.0.1"
            )
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")
        return self

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"
