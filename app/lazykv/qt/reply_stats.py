"""Per-reply figures shown under each reply: time to first token and generation speed.

Measured where the user sees them, on the GUI thread: from the request to the first token that
arrives (prompt processing included), then tokens per second over the rest of the reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lazykv.core.chat.conversation import ReplyStats


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

    def stats(self) -> ReplyStats | None:
        """What is shown under the reply and stored with it; None before any token."""
        ttft = self.time_to_first_token
        return None if ttft is None else ReplyStats(ttft, self.tokens_per_second, self.n_tokens)
