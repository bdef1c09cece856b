"""What encrypting the conversation history costs: open, search and save, plain SQLite vs SQLCipher.

``python -m bench.store_cost`` (part of ``make bench``) writes bench/results/store_cost.md. The same
history (CONVERSATIONS conversations of TURNS messages from the bench corpus) is written to a plain
and to an encrypted database; then, each REPEATS times in alternation: opening the database (a new
connection, the schema check and the list of conversations), a full-text search, and saving one
turn (``sync_transcript``, one transaction). Medians in milliseconds; the ratio encrypted / plain.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lazykv.core.history.keys import database_key
from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Store

RESULTS = Path(__file__).resolve().parent / "results" / "store_cost.md"
CONVERSATIONS = 300
TURNS = 20
WORDS_PER_TURN = 80
REPEATS = 100
QUERIES = ("river", "the mountain", "light wind")
KEY = database_key(os.urandom(32))


def _history() -> list[list[dict[str, str]]]:
    words = (Path(__file__).resolve().parent / "corpus.txt").read_text(encoding="utf-8").split()
    history, at = [], 0
    for _ in range(CONVERSATIONS):
        turns = []
        for i in range(TURNS):
            text = " ".join(words[(at + j) % len(words)] for j in range(WORDS_PER_TURN))
            at += WORDS_PER_TURN
            turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        history.append(turns)
    return history


def _fill(path: Path, key: bytes | None, history: list[list[dict[str, str]]]) -> list[str]:
    store = Store(path, path.parent / "snapshots", key=key)
    uids = [new_uid() for _ in history]
    for uid, turns in zip(uids, history, strict=True):
        store.sync_transcript(uid, turns, 0, title=turns[0]["content"][:40], create=True)
    store.close()
    return uids


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def _open(path: Path, key: bytes | None) -> None:
    store = Store(path, path.parent / "snapshots", key=key)
    store.list_conversations()
    store.close()


def measure(root: Path) -> dict[str, dict[str, float]]:
    history = _history()
    paths = {"plain": (root / "plain" / "c.sqlite3", None), "encrypted": (root / "enc" / "c.sqlite3", KEY)}
    uids = {name: _fill(path, key, history) for name, (path, key) in paths.items()}
    timings: dict[str, dict[str, list[float]]] = {n: {"open": [], "search": [], "save": []} for n in paths}
    stores = {name: Store(path, path.parent / "snapshots", key=key) for name, (path, key) in paths.items()}
    transcripts = {name: [list(t) for t in history] for name in paths}
    try:
        for r in range(REPEATS):
            for name, (path, key) in paths.items():  # alternated, so drift hits both alike
                store = stores[name]
                timings[name]["open"].append(_ms(lambda p=path, k=key: _open(p, k)))
                query = QUERIES[r % len(QUERIES)]
                timings[name]["search"].append(_ms(lambda s=store, q=query: s.search(q)))
                turns = transcripts[name][r % CONVERSATIONS]
                synced = len(turns)
                turns.append({"role": "user", "content": f"one more question, number {r}"})
                uid = uids[name][r % CONVERSATIONS]
                timings[name]["save"].append(
                    _ms(lambda s=store, u=uid, t=turns, n=synced: s.sync_transcript(u, t, n))
                )
    finally:
        for store in stores.values():
            store.close()
    sizes = {name: float(path.stat().st_size) for name, (path, _) in paths.items()}
    return {
        name: {op: statistics.median(values) for op, values in ops.items()} | {"bytes": sizes[name]}
        for name, ops in timings.items()
    }


def report(result: dict[str, dict[str, float]]) -> str:
    plain, enc = result["plain"], result["encrypted"]
    lines = [
        "# Conversation history: plain SQLite vs SQLCipher",
        "",
        f"{CONVERSATIONS} conversations of {TURNS} messages ({WORDS_PER_TURN} words each); median of "
        f"{REPEATS} alternated runs; `python -m bench.store_cost`.",
        "",
        "| operation | plain (ms) | encrypted (ms) | encrypted / plain |",
        "|---|---:|---:|---:|",
    ]
    what = {"open": "open + list", "search": "full-text search", "save": "save one turn (1 transaction)"}
    for op, label in what.items():
        lines.append(f"| {label} | {plain[op]:.2f} | {enc[op]:.2f} | {enc[op] / plain[op]:.2f} |")
    lines += [
        "",
        f"Plain: the standard library's SQLite {sqlite3.sqlite_version}; encrypted: SQLCipher "
        f"{_cipher_version()} (AES-256, raw 256-bit key, no key derivation at open).",
        f"Database size: plain {plain['bytes'] / 1e6:.1f} MB, encrypted {enc['bytes'] / 1e6:.1f} MB. "
        f"Load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a loaded "
        "machine widens the spread; the runs alternate, so it hits both sides alike).",
        "",
    ]
    return "\n".join(lines)


def _cipher_version() -> str:
    from sqlcipher3 import dbapi2

    db = dbapi2.connect(":memory:")
    try:
        return f"{db.execute('PRAGMA cipher_version').fetchone()[0]} on SQLite {dbapi2.sqlite_version}"
    finally:
        db.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp))
    text = report(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
