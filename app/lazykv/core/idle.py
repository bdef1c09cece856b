"""Idle-time conversion: take a lazy cache's compaction pause (each step of the ladder's too) while the user
reads, not mid-reply."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # engine imports llama_cpp; settings import this module before the engine is checked
    from lazykv.core.engine.types import KvStatus

IDLE_FILL = 0.9  # the rung in use (the f16 view, a ladder's 8-bit rung) is at least this full
IDLE_DELAY_S = 2.0  # and the engine has been idle this long


def wants_idle_step(status: KvStatus | None) -> bool:
    """True when a lazy cache below its last rung is full enough that the next reply would likely convert."""
    return status is not None and status.next_rung is not None and status.fill >= IDLE_FILL
