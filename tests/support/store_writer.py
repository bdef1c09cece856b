"""A second LazyKV Chat, as far as the conversation database sees one: a child process that chats.

``python -m tests.support.store_writer DB SNAPSHOTS UID NAME N`` plays a window on conversation
UID: N times it adds a user turn and a reply named after NAME and saves them with
``Store.sync_transcript`` (adopting the stored transcript when another process's turns were
merged, as the app does), and in between creates, prunes and deletes a scratch conversation of its
own. Each turn it saw confirmed is printed as one line ``confirmed <content>``; a busy database
(the other process writing) is retried, as a user would.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from lazykv.core.history.records import StoreBusyError, TranscriptConflict
from lazykv.core.history.store import Store
from tests.support.history import append_message, create_conversation


def _retry(fn):  # type: ignore[no-untyped-def]
    while True:
        try:
            return fn()
        except StoreBusyError:
            time.sleep(0.01)


def main(db: str, snapshots: str, uid: str, name: str, n: int) -> None:
    store = Store(Path(db), Path(snapshots), busy_timeout_ms=50)
    messages: list[dict[str, str]] = []
    synced = 0
    for i in range(n):
        mine = [{"role": "user", "content": f"{name} asks {i}"},
                {"role": "assistant", "content": f"{name} hears {i}"}]  # fmt: skip
        wanted = messages + mine
        try:
            result = _retry(lambda w=wanted, s=synced: store.sync_transcript(uid, w, s, create=True))
        except TranscriptConflict:
            continue
        messages, synced = result.messages, len(result.messages)
        for m in mine:
            print("confirmed", m["content"], flush=True)
        scratch = _retry(lambda i=i: create_conversation(store, f"{name} scratch {i}"))
        _retry(lambda c=scratch: append_message(store, c, "user", "scratch"))
        _retry(lambda: store.prune_snapshots(0))
        _retry(lambda c=scratch: store.delete(c))
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
