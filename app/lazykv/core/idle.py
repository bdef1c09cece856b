"""Idle-time conversion: take the lazy cache's compaction pause while the user reads, not mid-reply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lazykv.core.kinds import KvMode, KvPhase

if TYPE_CHECKING:  # engine imports llama_cpp; settings import this module before the engine is checked
    from lazykv.core.engine import KvStatus

IDLE_FILL = 0.9  # the f16 view is at least this full
IDLE_DELAY_S = 2.0  # and the engine has been idle this long


def wants_idle_conversion(status: KvStatus | None) -> bool:
    """True when a lazy cache in its f16 phase is full enough that the next reply would likely convert."""
    return (
        status is not None
        and status.kv_mode is KvMode.LAZY
        and status.phase is KvPhase.F16
        and status.fill >= IDLE_FILL
    )
