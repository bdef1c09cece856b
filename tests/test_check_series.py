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
    assert steps[jinja] == ["test-jinja"]  # a changed test program (the template nesting bounds)
    assert any("test-backend-ops" in tests for tests in steps.values())
    assert "test-backend-ops" in cs.NOT_RUN  # built at every prefix, run by the Python suite


def test_a_patch_that_touches_gpu_code_compiles_what_it_changes(tmp_path: Path) -> None:
    """Section 4: the CUDA sources a patch changes compile (a header: the dispatcher that includes it), and
    the Vulkan backend with its shaders; a deleted file is not compiled."""
    cs = _check_series()
    patch = tmp_path / "0001-ggml-cuda-x.patch"
    src = "vendor/llama.cpp/ggml/src"

    def diff(path: str, mode: str) -> str:
        return f"diff --git a/{src}/{path} b/{src}/{path}\n{mode}\n"

    patch.write_text(diff("ggml-cuda/convert-rows.cu", "new file mode 100644")
                     + diff("ggml-cuda/convert-rows.cuh", "new file mode 100644")
                     + diff("ggml-cuda/old.cu", "deleted file mode 100644")
                     + diff("ggml-vulkan/vulkan-shaders/x.glsl", "index 1111111..2222222 100644")
                     + diff("ggml-cpu/ops.cpp", "index 3333333..4444444 100644"))
    devices = cs.changed_device_sources(patch)
    assert devices == {"cuda": ["convert-rows.cu", "convert-rows.cuh"], "vulkan": ["vulkan-shaders/x.glsl"]}
    assert cs.cuda_objects(devices["cuda"]) == [
        "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/convert-rows.cu.o",
        "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o"]
    steps = {step.patch.name[:4]: step.devices for step in cs.plan(1, 10_000)}
    assert set(steps["0021"]) == {"cuda"} and set(steps["0019"]) == {"cuda", "vulkan"}
    assert not steps["0020"]  # the CPU's fast paths: no GPU code


def test_the_summary_says_where_gpu_code_compiled_and_where_it_could_not(tmp_path: Path) -> None:
    cs = _check_series()
    steps = cs.plan(19, 20)
    steps[0].notes = ["vulkan compiled"]
    steps[1].notes = ["cuda not compiled: no nvcc", "vulkan compiled"]
    summary = cs.device_summary(steps)
    assert summary.startswith("GPU code: 0019 vulkan compiled; 0020 cuda not compiled: no nvcc")
    assert cs.device_summary(cs.plan(1, 2)) == "No prefix touches GPU code."


def test_a_build_dir_configured_for_another_worktree_starts_over(tmp_path: Path) -> None:
    """A device build configured by a --worktree run is emptied before the default worktree configures it
    (CMake refuses a cache made for another source directory); one made for the same source is kept."""
    cs = _check_series()
    src, other = tmp_path / "series-src", tmp_path / "series-src-devices"
    build = tmp_path / "build-series-vulkan"
    for configured_from, kept in ((src, True), (other, False)):
        build.mkdir(exist_ok=True)
        (build / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={configured_from}\n")
        (build / "ggml.o").write_bytes(b"")
        assert cs.configured_for(build, src) == build
        assert (build / "ggml.o").exists() == kept


def test_a_patch_subject_is_read_whole_where_the_header_folds_it() -> None:
    """--state-bytes asks whether series-src is at the tip by the last patch's subject, which
    format-patch folds over two lines when it is long."""
    cs = _check_series()
    subjects = [cs.patch_subject(p) for p in cs.build.patch_files()]
    assert all(s and "\n" not in s and "  " not in s for s in subjects)
    assert subjects[-1] == "python : a template jinja2 cannot compile no longer fails Llama()"


def test_states_are_compared_byte_for_byte(tmp_path: Path) -> None:
    cs = _check_series()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"\x00\x01\x02\x03")
    b.write_bytes(b"\x00\x01\x07\x03")
    c.write_bytes(b"\x00\x01")
    assert cs.differing(a, a) == (0, -1)
    assert cs.differing(a, b) == (1, 2)
    assert cs.differing(a, c) == (4, 0)  # another size: every byte counts as differing
