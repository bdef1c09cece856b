"""``python -m lazykv --self-test`` (unfrozen): the check that `make dist-check` runs on the bundle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lazykv import selftest


def _self_test(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lazykv", "--self-test", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_self_test_passes_and_reports(smollm2_path: Path, _data_dir: Path, _config_dir: Path) -> None:
    run = _self_test("--model", str(smollm2_path))
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for label in ("engine", "qt", "icon", "first window", "first token", "lazy cache", "conversion",
                  "snapshot"):
        assert f"  {label}" in out
    assert "f16 view" in out and "forced to q8_0" in out and "restored in" in out
    assert out.rstrip().endswith("self-test passed")
    times = dict(item.split("=") for item in out.split("times: ", 1)[1].splitlines()[0].split())
    assert 0 < float(times["first_window"]) < float(times["first_token"])
    # it worked in a temp dir of its own: nothing was written to the (test's) user dirs
    assert not any(_data_dir.iterdir()) and not any(_config_dir.iterdir())


def test_self_test_fails_clearly_without_the_model(tmp_path: Path) -> None:
    run = _self_test(env={"XDG_CACHE_HOME": str(tmp_path)})
    assert run.returncode == 1
    assert "self-test FAILED: model: model file not found" in run.stdout
    assert "make models" in run.stdout


def test_self_test_fails_when_the_engine_library_cannot_load(tmp_path: Path, smollm2_path: Path) -> None:
    """The frozen-app trap, unfrozen: llama_cpp pointed at a folder without libllama."""
    run = _self_test("--model", str(smollm2_path), env={"LLAMA_CPP_LIB_PATH": str(tmp_path)})
    assert run.returncode == 1
    assert "self-test FAILED: engine:" in run.stdout
    assert "Shared library with base name 'llama' not found" in run.stdout


def test_process_start_time_is_when_the_process_started() -> None:
    """In a fresh process (this one may have run for many minutes): a few seconds ago at most."""
    code = "import time; from lazykv import selftest; print(time.time() - selftest.process_start_time())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    age = float(out)
    assert 0.0 <= age < 60.0


def test_platform_plugin_names(tmp_path: Path) -> None:
    (tmp_path / "platforms").mkdir()
    for name in ("libqxcb.so", "libqoffscreen.so", "qwindows.dll", "libqcocoa.dylib"):
        (tmp_path / "platforms" / name).touch()
    assert selftest._platform_plugins(tmp_path) == ["cocoa", "offscreen", "windows", "xcb"]
