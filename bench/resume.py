"""Resume benchmark: restoring a conversation's KV snapshot vs re-reading its transcript.

``python -m bench.resume`` (part of ``make bench``) writes bench/results/resume.md. For SmolLM2 with
conversations of about 1k and 4k tokens: the time to resume from the snapshot file (header check,
decrypt, decompress, restore) against the time to re-prefill the same tokens, both measured in the
same run; snapshot bytes per token for f16, q8_0 and lazy; the save latency.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.history.persistence import Crypto, Persistence
from lazykv.core.history.records import new_uid
from lazykv.core.history.snapshot import ENCRYPTION_KEYRING
from lazykv.core.history.store import Database
from lazykv.core.models import model_fetch

RESULTS = Path(__file__).resolve().parent / "results" / "resume.md"
N_CTX = 8192
SIZES = (1000, 4000)
REPEATS = 3
TARGET = 50.0
KEY = os.urandom(32)


def conversation(n_tokens: int, session: EngineSession) -> list[dict[str, str]]:
    """A user/assistant transcript of about n_tokens tokens (from the bench corpus)."""
    corpus = (Path(__file__).resolve().parent / "corpus.txt").read_text(encoding="utf-8").split()
    turns: list[dict[str, str]] = []
    words = iter(corpus * 10)
    while session.count_tokens(turns) < n_tokens:
        role = "user" if len(turns) % 2 == 0 else "assistant"
        turns.append({"role": role, "content": " ".join(next(words) for _ in range(120))})
    return turns


def measure(model: Path, kv_mode: str, n_tokens: int, data: Path) -> dict[str, float]:
    db = Database(data / "db.sqlite3", data / "snapshots")
    session = EngineSession()
    session.load(LoadSpec(model, n_ctx=N_CTX, kv_mode=kv_mode, kv_recent=0))
    persistence = Persistence(db, session, data / "fp.json", Crypto(ENCRYPTION_KEYRING, KEY))
    turns = conversation(n_tokens, session)
    conv = db.call(lambda store: store.sync_transcript(new_uid(), turns, 0, title="bench", create=True)).id
    prefill, resume, save = [], [], []
    n = 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        n = session.rebuild_kv(turns, lambda done, total: None, chunk=512)
        prefill.append(time.perf_counter() - t0)
        saved = persistence.save(conv, turns)
        save.append(saved.seconds)
        session.clear_kv()
        t0 = time.perf_counter()
        result = persistence.open(conv, turns, lambda done, total: None)
        resume.append(time.perf_counter() - t0)
        assert result.how == "restored", result.note
    # a reply after the resume works
    ask = [*turns, {"role": "user", "content": "Go on."}]
    list(session.stream_reply(ask, SamplingSettings(temperature=0), threading.Event(), max_tokens=4))
    size = db.call(lambda store: store.conversation(conv).snapshot.size)
    session.close()
    db.close()
    return {"tokens": n, "prefill": statistics.median(prefill), "resume": statistics.median(resume),
            "save": statistics.median(save), "bytes": size}


def main() -> int:
    model = model_fetch.models_dir() / model_fetch.MODELS["smollm2"].filename
    rows = []
    with tempfile.TemporaryDirectory(prefix="lazykv-bench-resume-") as tmp:
        for kv_mode in ("f16", "q8_0", "lazy"):
            for n in SIZES:
                data = Path(tmp) / f"{kv_mode}-{n}"
                r = measure(model, kv_mode, n, data)
                rows.append((kv_mode, r))
                print(kv_mode, r, flush=True)
    lines = [
        "# Resume from a KV snapshot vs re-reading the transcript",
        "",
        f"`python -m bench.resume`: SmolLM2-135M Q4_1, n_ctx {N_CTX}, {os.cpu_count()} CPU threads, "
        f"median of {REPEATS}. *Re-prefill* reads the transcript into an empty cache; *resume* opens the "
        "snapshot file (header check against the engine, AES-256-GCM decrypt, decompress, restore). "
        "At n_ctx 8192 the lazy cache's breakpoint is 4352 cells: both lazy rows are in its f16 phase.",
        "",
        "| KV mode | tokens | re-prefill s | resume ms | ratio (goal >= 50x) | snapshot | bytes/token "
        "| save ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kv_mode, r in rows:
        ratio = r["prefill"] / r["resume"]
        lines.append(
            f"| {kv_mode} | {r['tokens']} | {r['prefill']:.2f} | {1000 * r['resume']:.1f} | {ratio:.0f}x "
            f"{'PASS' if ratio >= TARGET else 'MISS'} | {r['bytes'] / 2**20:.2f} MiB | "
            f"{r['bytes'] / r['tokens']:.0f} | {1000 * r['save']:.0f} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
