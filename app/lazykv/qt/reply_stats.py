"""Per-reply figures shown under each reply: time to first token and generation speed.

Measured where the user sees them, on the GUI thread: from the request to the first token that
arrives (prompt processing included), then tokens per second over the rest of the reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ReplyClock:
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    n_tokens: int = 0

    def token(self) -> None:
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.n_tokens += 1

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def tokens_per_second(self) -> float | None:
        if self.n_tokens < 2 or self.first_token is None or self.last_token is None:
            return None
        span = self.last_token - self.first_token
        return (self.n_tokens - 1) / span if span > 0 else None

    def summary(self) -> str:
        """E.g. "0.42 s to first token · 31.5 tokens/s · 64 tokens"; "" before any token."""
        ttft = self.time_to_first_token
        if ttft is None:
            return ""
        parts = [f"{ttft:.2f} s to first token"]
        if (rate := self.tokens_per_second) is not None:
            parts.append(f"{rate:.1f} tokens/s")
        parts.append(f"{self.n_tokens} token{'s' if self.n_tokens != 1 else ''}")
        return " · ".join(parts)
