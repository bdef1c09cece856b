"""The damaged-state corpus: truncated and bit-flipped saved state, restored through every
state API (whole / sequence x memory / file), for both real models and every cache kind
(f16, q8_0, lazy before and after its conversion).

Each model and cache kind runs in a child process (state_corpus_child.py, all four APIs), so
that an abort fails one case instead of killing pytest. Pass: the child never dies; every refused restore
leaves a context that decodes exactly like a fresh one; a restore of damage the format
cannot detect (a flipped bit in a K/V value) may succeed, but decoding afterwards never
crashes.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .state_corpus_child import APIS, N_FLIPS, N_TRUNCATIONS

MODES = ["f16", "q8_0", "lazy-before", "lazy-after"]
ROOT = Path(__file__).resolve().parents[2]


def run_child(model: Path, mode: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.native.state_corpus_child", str(model), mode],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        started = [line["start"] for line in lines if "start" in line]
        pytest.fail(
            f"the child died (rc {proc.returncode}) at variant {started[-1] if started else 'set-up'}:\n"
            + proc.stderr[-3000:]
        )
    return lines


@pytest.mark.parametrize("mode", MODES)
def test_damaged_state_never_crashes(model_path: Path, mode: str) -> None:
    lines = run_child(model_path, mode)
    assert lines and lines[-1].get("done"), "the child did not finish its variants"
    results = [line for line in lines if "variant" in line]
    for api in APIS:  # offsets may coincide on small states
        assert sum(r["variant"].startswith(api + ":") for r in results) >= N_TRUNCATIONS + N_FLIPS - 4
    unusable = [r["variant"] for r in results if not r["usable"]]
    assert not unusable, f"refused, but the context no longer decodes like a fresh one: {unusable}"
    truncated = [r for r in results if ":truncate" in r["variant"]]
    assert all(r["outcome"] == "refused" for r in truncated), "a truncated state was restored"
    counts = collections.Counter(r["outcome"] for r in results)
    print(f"\n[corpus] {model_path.stem} {mode}: {len(results)} variants, {dict(counts)}")
