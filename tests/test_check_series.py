"""native/check_series.py's plan (issue 46, section 4): what each prefix of the series builds and runs,
from the patch files themselves; no build."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.native_scripts import load_native_script

ROOT = Path(__file__).resolve().parents[1]


def _check_series() -> ModuleType:
    return load_native_script("check_series.py", "lazykv_check_series")


def test_every_prefix_builds_common_and_test_backend_ops() -> None:
    assert {"llama", "ggml", "llama-common", "test-backend-ops"} <= set(_check_series().ALWAYS_BUILT)


def test_a_patch_runs_the_tests_it_adds_or_changes_never_one_it_deletes(tmp_path: Path) -> None:
    cs = _check_series()
    patch = tmp_path / "0001-tests-x.patch"
    patch.write_text(
        "diff --git a/vendor/llama.cpp/tests/test-added.cpp b/vendor/llama.cpp/tests/test-added.cpp\n"
        "new file mode 100644\n"
        "diff --git a/vendor/llama.cpp/tests/test-changed.cpp b/vendor/llama.cpp/tests/test-changed.cpp\n"
        "index 1111111..2222222 100644\n"
        "diff --git a/vendor/llama.cpp/tests/test-gone.cpp b/vendor/llama.cpp/tests/test-gone.cpp\n"
        "deleted file mode 100644\n"
        "diff --git a/vendor/llama.cpp/src/llama.cpp b/vendor/llama.cpp/src/llama.cpp\n"
        "index 3333333..4444444 100644\n")
    assert cs.changed_tests(patch) == ["test-added", "test-changed"]
    steps = {step.patch.name: step.tests for step in cs.plan(1, 10_000)}
    jinja = next(name for name in steps if "jinja-bound-the-nesting" in name)
    assert steps[jinja] == ["test-jinja"]  # a changed test program (0028's nesting bounds)
    assert any("test-backend-ops" in tests for tests in steps.values())
    assert "test-backend-ops" in cs.NOT_RUN  # built at every prefix, run by the Python suite
