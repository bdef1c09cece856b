"""Crafted GGUF files never abort the app: model_meta refuses them, and so EngineSession.load does.

Every file of ``tests/support/crafted_gguf.py`` goes through ``read_model_meta`` in this
process (bounded Python memory) and through ``EngineSession.load`` in a child process of its
own, so that an abort in llama.cpp fails that one case instead of killing pytest. The module
ends with a summary line: how many files of each class were refused, loaded or crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lazykv
from lazykv.core.engine.model_meta import GGUFError, read_model_meta
from tests.support.crafted_gguf import CASES, Case, write_corpus
from tests.support.summary import write_summary

CHILD_TIMEOUT_S = 60
MAX_META_PEAK = 1 << 20  # Python memory model_meta may allocate for any file of the corpus
MAX_CHILD_RSS = 600 << 20  # a child's peak RSS: interpreter, numpy, engine, and the loaded file
# loads each file named on the command line in turn, one result line per file, flushed
# the peak is VmHWM, this process image's own: ru_maxrss survives execve and would report the parent
# test process's size at fork time
CHILD = """
import json, sys
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.types import ModelFileError
from lazykv.core.errors import EngineError
for path in sys.argv[1:]:
    out = {"path": path}
    try:
        info = EngineSession().load(LoadSpec(path, n_ctx=256, kv_recent=0))
        out.update(outcome="loaded", architecture=info.architecture)
    except EngineError as err:
        out.update(outcome="refused", type=type(err).__name__, message=str(err),
                   model_file_error=isinstance(err, ModelFileError))
    with open("/proc/self/status") as status:
        hwm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    out["maxrss"] = hwm_kb * 1024
    print("RESULT " + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class ChildResult:
    returncode: int  # of the child that loaded this file: 0, or how it died while loading it
    result: dict[str, Any]  # what the child printed for this file; empty if it died loading it
    output: str

    @property
    def outcome(self) -> str:
        if self.result:
            return str(self.result["outcome"])
        return f"killed by signal {-self.returncode}" if self.returncode < 0 else f"exit {self.returncode}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("crafted"))


def _run_child(paths: list[Path]) -> tuple[int, list[dict[str, Any]], str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(lazykv.__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True,
                              text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return -9, _results(out), f"timed out after {CHILD_TIMEOUT_S} s"
    return proc.returncode, _results(proc.stdout), proc.stdout + proc.stderr


def _results(stdout: str) -> list[dict[str, Any]]:
    lines = stdout.splitlines()
    return [json.loads(line.removeprefix("RESULT ")) for line in lines if line.startswith("RESULT ")]


def load_all_in_children(paths: dict[str, Path]) -> dict[str, ChildResult]:
    """Every file through EngineSession.load in a child process; a child that dies ends only its file.

    One child takes the files in turn while none aborts (seconds instead of one start-up per file);
    after a death the next child starts with the file after the one that killed it.
    """
    results: dict[str, ChildResult] = {}
    names = list(paths)
    while names:
        rc, printed, output = _run_child([paths[n] for n in names])
        for name, result in zip(names, printed, strict=False):
            results[name] = ChildResult(0, result, "")
        names = names[len(printed):]
        if names and rc == 0:
            raise AssertionError(f"the child exited 0 without a result for {names[0]}:\n{output[-3000:]}")
        if names:
            results[names.pop(0)] = ChildResult(rc, {}, output)
    return results


@pytest.fixture(scope="module")
def engine_results(corpus: dict[str, Path],
                   request: pytest.FixtureRequest) -> Iterator[dict[str, ChildResult]]:
    """Every file loaded by EngineSession in child processes; a summary line at the end."""
    results = load_all_in_children(corpus)
    yield results
    tally = Counter(f"{case.kind}: {results[case.name].outcome}" for case in CASES)
    peak = max(int(r.result.get("maxrss", 0)) for r in results.values())
    line = (f"crafted GGUF corpus: {len(CASES)} files through EngineSession.load in child processes, "
            f"{sum(r.returncode == 0 for r in results.values())} without an abort; "
            + ", ".join(f"{k} {n}" for k, n in sorted(tally.items()))
            + f"; largest child peak RSS {peak >> 20} MiB")
    write_summary(request.config, line)


def _ids(case: Case) -> str:
    return case.name


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_model_meta_reads_or_refuses_in_bounded_memory(case: Case, corpus: dict[str, Path]) -> None:
    tracemalloc.start()
    try:
        meta = read_model_meta(corpus[case.name])
        refusal = None
    except GGUFError as err:
        meta, refusal = None, err
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < MAX_META_PEAK, f"model_meta allocated {peak} bytes for {case.name}"
    if case.refusal is None:
        assert refusal is None and meta is not None and meta.architecture == "llama"
        return
    assert refusal is not None, f"{case.name} was accepted"
    message = str(refusal)
    assert case.refusal in message
    assert message.startswith(f"{case.name}.gguf ") and message.endswith(".") and "\n" not in message
    assert refusal.details


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_engine_load_refuses_without_abort(case: Case, engine_results: dict[str, ChildResult]) -> None:
    child = engine_results[case.name]
    assert child.returncode == 0, f"{case.name}: child {child.outcome}:\n{child.output[-3000:]}"
    assert int(child.result["maxrss"]) < MAX_CHILD_RSS
    if case.refusal is None:
        assert child.result["outcome"] == "loaded", child.result
        return
    assert child.result["outcome"] == "refused", child.result
    assert child.result["model_file_error"], child.result
    assert case.refusal in str(child.result["message"])


def test_corpus_is_large_and_varied() -> None:
    assert len(CASES) >= 20
    kinds = {c.kind for c in CASES}
    assert {"truncated", "huge-count", "huge-length", "wrong-type", "absurd", "not-gguf"} <= kinds

