"""A branch's KV cache from its parent's (Qt-free; runs on the engine's thread, as ``Persistence`` does).

A branch holds the first messages of its parent. Its cache is the parent's (its snapshot restored, or the
live cache when the parent is the conversation open in the engine) with the cells after those messages'
tokens removed (``EngineSession.keep_kv_prefix``): nothing is re-read, and the cells kept are the
parent's own bytes, so the branch's next-token logits are the parent's at that point, bit for bit, on
the rung the parent's cache had reached. Its snapshot is then saved, sharing the parent's pieces.

Where that cannot be exact the branch re-reads its transcript and ``BranchResult.note`` says why: a
snapshot of another model or engine, or one the loaded cache's settings cannot take (the restore
checks of ``Persistence``); a parent cache that does not start with the branch's tokens (its oldest
turns dropped by "drop oldest", or a transcript changed since); a sliding-window model (Gemma-3) whose
cache does not hold the window at the branch point. Its sliding layers' cache holds only the window and
a batch (the engine loads without ``swa_full``), and a snapshot (llama.cpp's sequence state) only the
window's last ``n_swa`` positions; both carry the engine's window checkpoints (``WindowCheckpoints``: the
ends of the last replies, or of the last messages read). A branch at a checkpoint is exact; before one it
reads again what follows the nearest checkpoint (and says so); with none before it, all of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lazykv.core.chat.conversation import common_prefix
from lazykv.core.history.persistence import OpenHow, Persistence, Refused, SaveResult
from lazykv.core.history.records import StoreError
from lazykv.core.history.snapshot import SnapshotError

SWA_SNAPSHOT_NOTE = ("this model's snapshot keeps only its sliding window's last cells and its window "
                     "checkpoints, none of them at or before this point")
SWA_LIVE_NOTE = "this model's sliding-window cache no longer holds that point of the parent"
CHECKPOINT_NOTE = "read {n} tokens again from the parent's nearest window checkpoint before this point"


@dataclass(frozen=True)
class BranchResult:
    how: OpenHow  # RESTORED: from the parent's cache; REBUILT: re-read, ``note`` says why; EMPTY
    note: str  # one line for the user ("" when it came from the parent's cache)
    n_tokens: int  # tokens in the branch's cache
    seconds: float  # to make the cache, not counting the save
    details: str = ""  # the technical reason of a re-read
    saved: SaveResult | None = None  # the branch's snapshot (None: snapshots are off, or the save failed)
    save_error: str = ""  # why it was not saved


def open_branch(
    persistence: Persistence,
    parent_id: int,
    parent_messages: Sequence[dict[str, str]],
    branch_id: int,
    n_messages: int,
    on_progress: Callable[[int, int], None],
    *,
    live: bool = False,
    budget_bytes: int = 0,
    compact: bool = False,
) -> BranchResult:
    """Make the cache of conversation ``branch_id``, which holds the first ``n_messages`` of its parent's
    ``parent_messages`` (as the engine is sent them, the system prompt included), from the parent's;
    ``live``: the engine's cache is the parent's now (the parent is open), else the parent's snapshot is
    restored. Then save the branch's snapshot (when snapshots are on), sharing the parent's pieces."""
    if not 0 <= n_messages <= len(parent_messages):
        raise ValueError(f"a branch holds 0 to {len(parent_messages)} of its parent's messages, "
                         f"not {n_messages}")
    engine = persistence.engine
    messages = list(parent_messages[:n_messages])
    t0 = time.perf_counter()
    if not any(m["role"] != "system" for m in messages):
        engine.clear_kv()
        return BranchResult(OpenHow.EMPTY, "", 0, time.perf_counter() - t0)
    try:
        tokens = engine.transcript_tokens(messages)
        if not live:
            persistence.restore(parent_id, parent_messages)
        if common_prefix(engine.cached_tokens(), tokens) < len(tokens):
            raise Refused("the parent's cache does not hold this part of the conversation as it reads now "
                          "(its oldest turns were dropped, or it changed)")
        if not engine.keep_kv_prefix(len(tokens)):
            read = engine.reread_from_checkpoint(len(tokens))
            if read is None:
                raise Refused(SWA_LIVE_NOTE if live else SWA_SNAPSHOT_NOTE)
            result = BranchResult(OpenHow.REBUILT, CHECKPOINT_NOTE.format(n=read), read,
                                  time.perf_counter() - t0)
        else:
            result = BranchResult(OpenHow.RESTORED, "", len(tokens), time.perf_counter() - t0)
    except Refused as refused:
        n = engine.rebuild_kv(messages, on_progress)
        result = BranchResult(OpenHow.REBUILT, refused.note, n, time.perf_counter() - t0, refused.details)
    if persistence.crypto is None:
        return result
    try:
        saved = persistence.save(branch_id, messages, budget_bytes, compact)
    except (SnapshotError, StoreError, OSError) as err:
        return BranchResult(result.how, result.note, result.n_tokens, result.seconds, result.details,
                            save_error=str(err))  # fmt: skip
    return BranchResult(result.how, result.note, result.n_tokens, result.seconds, result.details, saved)
