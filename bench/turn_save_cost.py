"""What saving one turn costs as the history grows: 500 against 5,000 conversations (issue 24, point 7).

``python -m bench.turn_save_cost`` (part of ``make bench``) writes bench/results/turn_save_cost.md.
Two histories of SMALL and LARGE conversations of TURNS messages each (the bench corpus's words)
are written; then, REPEATS times, the same save runs on each, in alternating order: the job the app
runs on the database thread after a turn (``Store.sync_transcript`` appending one message to a
conversation, then ``Store.summary`` for the list's row of that conversation). Each pair gives the
ratio large / small; the report gives the median ratio (the target: at most 1.2) and the medians
in milliseconds. For comparison, the same save followed by the whole list (what the app did before:
``list_conversations()``, to find the row) is measured the same way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lazykv.core.history.records import new_uid
from lazykv.core.history.store import Store

RESULTS = Path(__file__).resolve().parent / "results" / "turn_save_cost.md"
SMALL, LARGE = 500, 5000
TURNS = 50
WORDS_PER_TURN = 30
REPEATS = 200
TARGET = 1.2  # large / small, median of the paired runs


def _turns(words: list[str], at: int) -> list[dict[str, str]]:
    turns = []
    for i in range(TURNS):
        text = " ".join(words[(at + i * WORDS_PER_TURN + j) % len(words)] for j in range(WORDS_PER_TURN))
        turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return turns


def _fill(root: Path, n: int, words: list[str]) -> tuple[Store, list[str], list[list[dict[str, str]]]]:
    """A history of ``n`` conversations; the store, the uids and transcripts of the first SMALL."""
    store = Store(root / "c.sqlite3", root / "snapshots")
    uids, transcripts = [], []
    for k in range(n):
        uid, turns = new_uid(), _turns(words, k * 7919)
        store.sync_transcript(uid, turns, 0, title=turns[0]["content"][:40], create=True)
        if k < SMALL:
            uids.append(uid)
            transcripts.append(turns)
    return store, uids, transcripts


def _save(store: Store, uid: str, turns: list[dict[str, str]], whole_list: bool) -> float:
    """Milliseconds of one turn's save: one message appended, then the list's row of its conversation."""
    synced = len(turns)
    turns.append({"role": "user" if synced % 2 == 0 else "assistant", "content": f"one more turn, {synced}"})
    t0 = time.perf_counter()
    conv_id = store.sync_transcript(uid, turns, synced).id
    if whole_list:
        next(s for s in store.list_conversations() if s.id == conv_id)
    else:
        store.summary(conv_id)
    return 1000 * (time.perf_counter() - t0)


def measure(root: Path, repeats: int = REPEATS) -> dict[str, dict[str, float]]:
    words = (Path(__file__).resolve().parent / "corpus.txt").read_text(encoding="utf-8").split()
    histories = {name: _fill(root / name, n, words) for name, n in (("small", SMALL), ("large", LARGE))}
    result: dict[str, dict[str, float]] = {}
    try:
        for method, whole_list in (("row", False), ("whole list", True)):
            times: dict[str, list[float]] = {"small": [], "large": []}
            ratios = []
            for r in range(repeats):
                order = ("small", "large") if r % 2 == 0 else ("large", "small")  # drift hits both alike
                pair: dict[str, float] = {}
                for name in order:
                    store, uids, transcripts = histories[name]
                    k = r % SMALL
                    pair[name] = _save(store, uids[k], transcripts[k], whole_list)
                    times[name].append(pair[name])
                ratios.append(pair["large"] / pair["small"])
            result[method] = {"small": statistics.median(times["small"]),
                              "large": statistics.median(times["large"]), "ratio": statistics.median(ratios)}
    finally:
        for store, _, _ in histories.values():
            store.close()
    return result


def report(result: dict[str, dict[str, float]], repeats: int, command: str) -> str:
    row = result["row"]
    verdict = "PASS" if row["ratio"] <= TARGET else "MISS"
    lines = [
        "# Saving a turn: 500 against 5,000 conversations",
        "",
        f"Histories of {SMALL} and {LARGE} conversations of {TURNS} messages ({WORDS_PER_TURN} words each); "
        f"one message appended to a conversation and its list row read, on each history in alternating "
        f"order, {repeats} pairs; `{command}`.",
        "",
        f"Target: a save with {LARGE} conversations costs at most {TARGET}x the same save with {SMALL} "
        f"(median of the paired ratios): **{row['ratio']:.2f}x, {verdict}**.",
        "",
        f"| the list's row found by | {SMALL} (ms) | {LARGE} (ms) | ratio (median of pairs) |",
        "|---|---:|---:|---:|",
    ]
    labels = {"row": "`Store.summary(id)` (the app)", "whole list": "`list_conversations()` (before)"}
    for method, label in labels.items():
        r = result[method]
        lines.append(f"| {label} | {r['small']:.2f} | {r['large']:.2f} | {r['ratio']:.2f} |")
    lines += [
        "",
        f"Load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a loaded machine "
        "widens the spread; the pairs alternate, so it hits both sides alike).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_save_cost", description=__doc__)
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"pairs of saves (default {REPEATS})")
    args = parser.parse_args(argv)
    command = "python -m bench.turn_save_cost"
    command += f" --repeats {args.repeats}" if args.repeats != REPEATS else ""
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), args.repeats)
    text = report(result, args.repeats, command)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
