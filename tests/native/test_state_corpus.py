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


class Child:
    """One child process, its output in files (a pipe nobody reads would stall it)."""

    def __init__(self, model: Path, mode: str, tmp: Path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.out = (tmp / f"{model.stem}-{mode}.out").open("w+")
        self.err = (tmp / f"{model.stem}-{mode}.err").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.native.state_corpus_child", str(model), mode],
            stdout=self.out, stderr=self.err, text=True, cwd=ROOT, env=env,
        )

    def result(self) -> tuple[int, str, str]:
        try:
            rc = self.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.out.seek(0)
        self.err.seek(0)
        return rc, self.out.read(), self.err.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_started: dict[tuple[str, str], Child] = {}


@pytest.fixture(scope="module", autouse=True)
def _no_child_left():
    yield
    for child in _started.values():
        child.kill()
    _started.clear()


def run_child(model: Path, mode: str, tmp: Path) -> list[dict]:
    """The child of (model, mode); the next mode's child starts now, so that two run at once (the
    children are mostly single-threaded: loading, restoring, comparing)."""
    child = _started.pop((str(model), mode), None) or Child(model, mode, tmp)
    following = MODES[MODES.index(mode) + 1 :]
    if following and (str(model), following[0]) not in _started:
        _started[(str(model), following[0])] = Child(model, following[0], tmp)
    rc, stdout, stderr = child.result()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if rc != 0:
        started = [line["start"] for line in lines if "start" in line]
        pytest.fail(
            f"the child died (rc {rc}) at variant {started[-1] if started else 'set-up'}:\n" + stderr[-3000:]
        )
    return lines


@pytest.mark.parametrize("mode", MODES)
def test_damaged_state_never_crashes(
    model_path: Path, mode: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lines = run_child(model_path, mode, tmp_path_factory.getbasetemp())
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
