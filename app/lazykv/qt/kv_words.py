"""The KV cache's state in words, for the memory panel, the context indicator and the banner.

A lazy cache goes down its rungs (the window's "levels") one step at a time: 16-bit, then 8-bit (lazy
q8_0's last), then 4-bit (the ladder's). docs/glossary.md has the words."""

from __future__ import annotations

from lazykv.core.engine.types import KvStatus
from lazykv.core.kinds import KvPhase


def rung_line(status: KvStatus) -> str:
    """``16-bit: 230 of 1,152 tokens · next 8-bit: 2,168``: the rung in use, how full, and the next one."""
    if status.phase is KvPhase.CONVERTING:
        return f"compacting to {_target(status).words}… at {status.n_cells_used:,} tokens"
    line = f"{status.phase.words}: {status.n_cells_used:,} of {status.n_cells_capacity:,} tokens"
    rung = status.next_rung
    if rung is not None:
        return f"{line} · next {rung.words}: {status.n_cells_next:,}"
    return f"{line} · the last level" if status.rungs else line


def meter_line(status: KvStatus) -> str:
    """``Context 230 / 4,096 tokens · 16-bit up to 1,152 · next 8-bit up to 2,168``."""
    head = f"Context {min(status.n_cells_used, status.n_cells_total):,} / {status.n_cells_total:,} tokens"
    if status.phase is KvPhase.CONVERTING:
        return f"{head} · compacting to {_target(status).words}…"
    rung = status.next_rung
    if rung is not None:
        return (f"{head} · {status.phase.words} up to {status.n_cells_capacity:,} · next {rung.words} up to "
                f"{status.n_cells_next:,}")
    return f"{head} · {status.phase.words}"


def rungs_sentence(status: KvStatus) -> str:
    """The whole way down, for a tooltip: the rungs in order."""
    if not status.rungs:
        return f"The cache is stored at {status.phase.words}."
    rungs = ", then ".join(f"{rung.words}" for rung in status.rungs)
    return (f"This cache is stored at {rungs}: each level starts when the one before is full, compacting the "
            f"context memory in place (a short pause). It holds {status.n_cells_total:,} tokens at its last "
            "level.")


def _target(status: KvStatus) -> KvPhase:
    return status.target or KvPhase.Q8_0
