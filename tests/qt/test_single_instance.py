"""Issue 17.1: one running LazyKV Chat; starting it again brings the first one's window forward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.qt.instance_probe import SECOND

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180  # a loaded 2-core CI machine: the first process may need a while to start its event loop


def _env(data_dir: Path) -> dict[str, str]:
    return {**os.environ, "LAZYKV_DATA_DIR": str(data_dir), "QT_QPA_PLATFORM": "offscreen",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "app"), os.environ.get("PYTHONPATH", "")])}


def _probe(data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.qt.instance_probe", str(data_dir)], cwd=ROOT,
                            env=_env(data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_process_defers_to_the_first_and_raises_it(tmp_path: Path) -> None:
    first = _probe(tmp_path / "data")
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "first"
        assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
        second = _probe(tmp_path / "data")
        assert second.wait(TIMEOUT_S) == SECOND and second.stdout is not None
        assert second.stdout.read().strip() == "second"
        assert first.stdout.readline().strip() == "activated"
        assert first.wait(TIMEOUT_S) == 0
    finally:
        first.kill()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    first = _probe(tmp_path)
    assert first.stdout is not None and first.stdout.readline().strip() == "first"
    first.kill()
    first.wait(TIMEOUT_S)
    again = _probe(tmp_path)
    try:
        assert again.stdout is not None and again.stdout.readline().strip() == "first"
    finally:
        again.kill()
        again.wait(TIMEOUT_S)


def test_other_data_directories_run_side_by_side(tmp_path: Path) -> None:
    a, b = _probe(tmp_path / "a"), _probe(tmp_path / "b")
    try:
        assert a.stdout is not None and b.stdout is not None
        assert a.stdout.readline().strip() == "first" and b.stdout.readline().strip() == "first"
    finally:
        for p in (a, b):
            p.kill()
            p.wait(TIMEOUT_S)
