#!/usr/bin/env python3
"""Check that every prefix of the patch series builds and passes the C++ tests it adds or changes.

The series must be bisectable: after each patch, libllama, ggml, common and test-backend-ops build,
and the llama.cpp test programs that the patch adds or changes build and pass (the Python tests need
the whole wheel and run on the full series only, in ``make test``). For each patch in order this
script

  1. applies it (``git am``) to a worktree of the pristine sdist (``native/work/series-src``) that
     holds the previous prefix, so only the files the patch touches change;
  2. configures (once) and builds the targets ``llama``, ``ggml``, ``llama-common`` and
     ``test-backend-ops`` and the test programs the patch adds or changes (its
     ``vendor/llama.cpp/tests/test-*.cpp`` files) in one incremental CMake build dir
     (``native/work/build-series``, Ninja, ccache when installed). The libraries are shared and, on
     Linux, linked with ``--no-undefined``: a static ``libllama.a`` is never linked whole, so a patch
     that declares functions no patch has defined yet would pass;
  3. runs those test programs (test-backend-ops, which compares backends, is built here and run by the
     Python suite on the full series);
  4. where the patch touches a GPU backend, compiles its code without a GPU, in a build dir of its own:
     the CUDA sources it touches (``nvcc``; cuBLAS's headers from PyPI's ``nvidia-cublas`` wheel when the
     toolkit has none; one architecture, object files only) and the Vulkan backend with its shaders
     (``glslc`` and the Vulkan headers: ``tools/sysdeps.sh vulkan``). Without the compiler a prefix says
     so ("cuda not compiled: no nvcc") and the summary counts it.

It stops at the first prefix that fails (``--keep-going`` goes on) and prints one line per prefix
and a summary; ``--record`` writes the summary of a full run into native/README.md. Slow: on two
cores a full run takes hours (every patch that touches a widely included header rebuilds most of
libllama). Run it in the background before a change to the series lands, not in ``make test``.

``--state-bytes`` (after a full run, with series-src at the series' tip) checks that the series leaves a
plain cache's saved state upstream's: it builds libllama at the rotation-record prefix (0001, upstream PR
#28498's format) beside the tip's, and ``native/state_bytes/state_dump.cpp`` against each; on SmolLM2, a
plain f16 and a plain q8_0 cache's sequence and context states of each build are read by the other and
written back, and must come back byte for byte (both ways); fresh f16 states must be equal too. Fresh q8_0
states are compared and reported: their rows' values may differ where the series changed a kernel.

Only the standard library is used (and, for ``--state-bytes``, the app's list of models).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
SERIES_SRC = NATIVE / "work" / "series-src"
SERIES_BUILD = NATIVE / "work" / "build-series"
DEVICE_BUILDS = {backend: NATIVE / "work" / f"build-series-{backend}" for backend in ("cuda", "vulkan")}
CUBLAS = NATIVE / "work" / "cublas"  # cuBLAS headers (and the libraries CMake's CUDA::cublas names) from PyPI
CUDA_ARCH = "90"  # one architecture: a compile check, not a build to run
README = NATIVE / "README.md"
RECORD_START = "<!-- check_series: last full run -->"
RECORD_END = "<!-- /check_series -->"
TEST_TIMEOUT_S = 1800
STATE_DUMP = NATIVE / "state_bytes" / "state_dump.cpp"
STATE_WORK = NATIVE / "work" / "state-bytes"  # the first prefix's worktree and build, the dumps


def _build_module():  # noqa: ANN202 - the module object of native/build.py
    spec = importlib.util.spec_from_file_location("lazykv_native_build", NATIVE / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build = _build_module()


@dataclass
class Step:
    index: int
    patch: Path
    tests: list[str]  # test programs the patch adds or changes (CMake target names)
    devices: dict[str, list[str]]  # GPU backend -> the sources of it that the patch adds or changes
    result: str = "not run"  # ok, build failed, test failed: NAME, cuda compile failed, does not apply...
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # "cuda compiled", "vulkan not compiled: no glslc"


# built at every prefix; test-backend-ops is not run here (it compares backends: the Python suite runs it)
ALWAYS_BUILT = ("llama", "ggml", "llama-common", "test-backend-ops")
NOT_RUN = ("test-backend-ops",)


def changed_tests(patch: Path) -> list[str]:
    """The llama.cpp test programs a patch adds or changes: its vendor/llama.cpp/tests/test-*.cpp files
    that it does not delete."""
    text = patch.read_text(errors="replace")
    diffs = re.findall(r"^diff --git a/\S+ b/vendor/llama\.cpp/tests/(test-[\w-]+)\.cpp\n(\S+)", text,
                       flags=re.MULTILINE)
    return sorted({name for name, mode in diffs if mode != "deleted"})


def changed_device_sources(patch: Path) -> dict[str, list[str]]:
    """The GPU backends a patch touches (cuda, vulkan) and the files of each that it adds or changes, relative
    to ggml/src/ggml-<backend>/."""
    text = patch.read_text(errors="replace")
    found: dict[str, list[str]] = {}
    pattern = r"^diff --git a/\S+ b/vendor/llama\.cpp/ggml/src/ggml-(cuda|vulkan)/(\S+)\n(\S+)"
    for backend, rel, mode in re.findall(pattern, text, flags=re.MULTILINE):
        if mode != "deleted":
            found.setdefault(backend, []).append(rel)
    return {backend: sorted(set(files)) for backend, files in sorted(found.items())}


def cuda_objects(files: list[str]) -> list[str]:
    """The Ninja targets of the CUDA object files that compile the changed sources: each changed .cu, and
    ggml-cuda.cu (the dispatcher, which includes the headers) whenever a header changes."""
    units = {f for f in files if f.endswith(".cu")}
    if any(f.endswith((".cuh", ".h")) for f in files):
        units.add("ggml-cuda.cu")
    return [f"ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/{u}.o" for u in sorted(units)]


def plan(first: int, last: int) -> list[Step]:
    patches = build.patch_files()
    return [Step(i, p, changed_tests(p), changed_device_sources(p)) for i, p in enumerate(patches, start=1)
            if first <= i <= last]


def run(cmd: list[str], cwd: Path | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=timeout)


def reset_worktree(upto: int, where: Path | None = None) -> None:
    """A worktree of SRC's repo (series-src unless ``where``) at the pristine sdist plus the first ``upto``
    patches."""
    where = where or SERIES_SRC
    build.ensure_pristine()
    if not where.exists():
        build.git("worktree", "prune")
        build.git("worktree", "add", "-q", "--detach", str(where), build.PRISTINE_TAG)
    run(["git", "am", "--abort"], cwd=where)
    res = run(["git", "reset", "-q", "--hard", build.PRISTINE_TAG], cwd=where)
    if res.returncode != 0:
        raise build.BuildError(f"cannot reset {where}: {res.stderr}")
    for patch in build.patch_files()[:upto]:
        if not apply(patch, where):
            raise build.BuildError(f"{patch.name} does not apply")


def apply(patch: Path, where: Path | None = None) -> bool:
    where = where or SERIES_SRC
    res = run(["git", *build.GIT_ID, "am", "-q", "--keep-cr", "--committer-date-is-author-date", str(patch)],
              cwd=where)
    if res.returncode != 0:
        run(["git", "am", "--abort"], cwd=where)
        return False
    return True


def cmake_args() -> list[str]:
    # shared libraries linked with --no-undefined: a static libllama.a "builds" even when a patch declares
    # functions that no patch defines yet (the linker never sees it whole), a shared one does not
    args = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=ON",
            "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_OPENSSL=OFF", "-DGGML_RPC=ON", "-DGGML_CPU_HUGE_PAGES=ON"]
    if build.platform.system() == "Linux":
        args += ["-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-undefined"]
    if build.platform.machine().lower() in ("x86_64", "amd64"):
        args += build.X86_64_CMAKE_ARGS
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    return args + os.environ.get("CMAKE_ARGS", "").split()


def cuda_toolkit() -> Path | None:
    """The CUDA toolkit's root (the one with cuda_runtime.h): CUDA_HOME, CUDA_PATH, nvcc's (through a wrapper
    script too, as CMake finds it: /usr/local/cuda), else None."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda"]
    found = [Path(c) for c in candidates if c and (Path(c) / "include" / "cuda_runtime.h").is_file()]
    return found[0] if found else None


def cublas_args() -> list[str] | str:
    """CMake arguments that give a toolkit without cuBLAS (a bare nvcc) the headers and the CUDA::cublas
    targets ggml-cuda links (never linked here: object files only); why not, when they cannot be had."""
    toolkit = cuda_toolkit()
    if toolkit is None:
        return "no CUDA toolkit (cuda_runtime.h) beside nvcc"
    if (toolkit / "include" / "cublas_v2.h").is_file():
        return []
    include = next(CUBLAS.glob("nvidia/*/include/cublas_v2.h"), None)
    if include is None:
        CUBLAS.mkdir(parents=True, exist_ok=True)
        res = run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CUBLAS),
                   "nvidia-cublas"])
        wheel = next(CUBLAS.glob("nvidia_cublas-*.whl"), None)
        if res.returncode != 0 or wheel is None:
            return "no cuBLAS headers (pip download nvidia-cublas failed)"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(CUBLAS, [n for n in z.namelist() if "/include/" in n or "/lib/libcublas" in n])
        include = next(CUBLAS.glob("nvidia/*/include/cublas_v2.h"), None)
        if include is None:
            return f"no cublas_v2.h in {wheel.name}"
    root = include.parent.parent
    lib = next(root.glob("lib/libcublas.so*"), None)
    lib_lt = next(root.glob("lib/libcublasLt.so*"), None)
    cudart = next((toolkit / "lib64").glob("libcudart.so*"), None)
    if not (lib and lib_lt and cudart):
        return f"no libcublas, libcublasLt or libcudart ({root}, {toolkit / 'lib64'})"
    flags = f"-I{include.parent}"
    # CUDA::cuda_driver names libcuda, which a machine without the driver lacks: any library stands in for
    # it, as nothing is linked
    return [f"-DCUDA_cublas_LIBRARY={lib}", f"-DCUDA_cublasLt_LIBRARY={lib_lt}",
            f"-DCUDA_cuda_driver_LIBRARY={cudart}", f"-DCMAKE_CUDA_FLAGS={flags}",
            f"-DCMAKE_CXX_FLAGS={flags}"]


def configured_for(build_dir: Path, src: Path) -> Path:
    """build_dir, emptied first when it was configured for another source tree (another --worktree): CMake
    refuses to reconfigure a cache for a different source directory."""
    cache = build_dir / "CMakeCache.txt"
    if cache.is_file():
        found = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(errors="replace"), re.M)
        if found is None or Path(found.group(1)) != src:
            shutil.rmtree(build_dir)
    return build_dir


def compile_device(backend: str, files: list[str], jobs: str, out) -> tuple[bool | None, str]:  # noqa: ANN001
    """Compile a GPU backend's changed code in its own build dir (configured as the prefix's, plus the
    backend): (True, note) when it compiled, (False, note) when it failed, (None, note) when this machine
    lacks the toolchain; the note says which."""
    src = SERIES_SRC / "vendor" / "llama.cpp"
    base = cmake_args()
    if backend == "cuda":
        if not shutil.which("nvcc"):
            return None, "cuda not compiled: no nvcc"
        extra = cublas_args()
        if isinstance(extra, str):
            return None, f"cuda not compiled: {extra}"
        args = [*base, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCH}", *extra]
        targets = cuda_objects(files)
    else:
        missing = build.vulkan_toolchain()
        if missing:
            return None, f"vulkan not compiled: no {', '.join(missing)} (tools/sysdeps.sh vulkan)"
        args = [*base, "-DGGML_VULKAN=ON"]
        targets = ["ggml-vulkan"]
    if not targets:
        return True, f"{backend}: nothing to compile"
    res = run(["cmake", "-S", str(src), "-B", str(configured_for(DEVICE_BUILDS[backend], src)), *args])
    out.write(res.stdout[-5000:] + res.stderr[-5000:])
    if res.returncode != 0:
        return False, f"{backend} configure failed"
    res = run(["cmake", "--build", str(DEVICE_BUILDS[backend]), "-j", jobs, "--target", *targets])
    out.write(res.stdout[-20000:] + res.stderr[-20000:])
    if res.returncode != 0:
        return False, f"{backend} compile failed"
    return True, f"{backend} compiled"


def build_and_test(step: Step, jobs: str, log: Path, devices_only: bool = False) -> str:
    src = SERIES_SRC / "vendor" / "llama.cpp"
    with log.open("a") as out:
        out.write(f"\n===== {step.patch.name}\n")
        for backend, files in step.devices.items():
            compiled, note = compile_device(backend, files, jobs, out)
            step.notes.append(note)
            if compiled is False:
                return note
        if devices_only:
            return "ok"
        res = run(["cmake", "-S", str(src), "-B", str(configured_for(SERIES_BUILD, src)), *cmake_args()])
        out.write(res.stdout + res.stderr)
        if res.returncode != 0:
            return "configure failed"
        targets = list(dict.fromkeys([*ALWAYS_BUILT, *step.tests]))
        res = run(["cmake", "--build", str(SERIES_BUILD), "-j", jobs, "--target", *targets])
        out.write(res.stdout[-20000:] + res.stderr[-20000:])
        if res.returncode != 0:
            return "build failed"
        for name in (t for t in step.tests if t not in NOT_RUN):
            try:
                res = run([str(SERIES_BUILD / "bin" / name)], cwd=SERIES_BUILD, timeout=TEST_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return f"test timed out: {name}"
            out.write(f"--- {name}: exit {res.returncode}\n{res.stdout[-20000:]}{res.stderr[-20000:]}")
            if res.returncode != 0:
                return f"test failed: {name}"
    return "ok"


def patch_subject(patch: Path) -> str:
    """The commit subject of a format-patch file (its folded Subject header joined again)."""
    match = re.search(r"^Subject: (?:\[PATCH[^]]*\] )?(.+(?:\n .+)*)", patch.read_text(errors="replace"),
                      re.MULTILINE)
    return " ".join(match.group(1).split()) if match else ""


def state_dump_program(src: Path, lib: Path, out: Path) -> None:
    """state_dump.cpp built against a build's libllama (src: its llama.cpp tree, lib: its bin dir)."""
    cxx = os.environ.get("CXX", "c++")
    res = run([cxx, "-O2", "-std=c++17", str(STATE_DUMP), "-I", str(src / "include"), "-I",
               str(src / "ggml" / "include"), "-L", str(lib), "-lllama", "-lggml", "-lggml-base",
               f"-Wl,-rpath,{lib}", "-o", str(out)])
    if res.returncode != 0:
        raise build.BuildError(f"state_dump does not build against {lib}: {res.stderr[-2000:]}")


def differing(a: Path, b: Path) -> tuple[int, int]:
    """(bytes that differ, the first that does; -1: none); files of another size differ everywhere."""
    x, y = a.read_bytes(), b.read_bytes()
    if len(x) != len(y):
        return max(len(x), len(y)), 0
    diff = [i for i in range(len(x)) if x[i] != y[i]] if x != y else []
    return len(diff), diff[0] if diff else -1


def state_bytes(jobs: str) -> int:
    """--state-bytes: a plain cache's states, the rotation-record prefix's build against the tip's."""
    patches = build.patch_files()
    tip_subject = run(["git", "log", "-1", "--format=%s"], cwd=SERIES_SRC).stdout.strip()
    tip_lib = SERIES_BUILD / "bin"
    if tip_subject != patch_subject(patches[-1]) or not (tip_lib / "libllama.so").exists():
        print(f"check_series: {SERIES_SRC} is not built at the series' tip: run a full check first",
              file=sys.stderr)
        return 2
    try:
        sys.path.insert(0, str(NATIVE.parent / "app"))
        from lazykv.core.models import model_fetch

        model = model_fetch.models_dir() / model_fetch.MODELS["smollm2"].filename
    except ImportError as err:
        print(f"check_series: the app's model list is not importable ({err})", file=sys.stderr)
        return 2
    if not model.is_file():
        print(f"check_series: {model} is missing: run `make models` first", file=sys.stderr)
        return 2

    # the rotation-record prefix in a worktree of its own, built with the series' flags
    first_src, first_build = STATE_WORK / "src", STATE_WORK / "build"
    try:
        reset_worktree(1, first_src)
    except build.BuildError as err:
        print(f"check_series: {err}", file=sys.stderr)
        return 1
    src = first_src / "vendor" / "llama.cpp"
    for cmd in (["cmake", "-S", str(src), "-B", str(first_build), *cmake_args()],
                ["cmake", "--build", str(first_build), "-j", jobs, "--target", "llama"]):
        res = run(cmd)
        if res.returncode != 0:
            print(f"check_series: {' '.join(cmd[:2])} failed for {patches[0].name}:\n{res.stderr[-4000:]}",
                  file=sys.stderr)
            return 1
    programs = {"first": STATE_WORK / "state_dump-first", "tip": STATE_WORK / "state_dump-tip"}
    try:
        state_dump_program(src, first_build / "bin", programs["first"])
        state_dump_program(SERIES_SRC / "vendor" / "llama.cpp", tip_lib, programs["tip"])
    except build.BuildError as err:
        print(f"check_series: {err}", file=sys.stderr)
        return 1

    def dump(who: str, kv: str, out: str, source: str | None = None) -> Path:
        res = run([str(programs[who]), str(model), kv, str(STATE_WORK / out),
                   *([str(STATE_WORK / source)] if source else [])], timeout=600)
        if res.returncode != 0:
            raise build.BuildError(f"state_dump ({who}, {kv}) failed: {res.stderr[-2000:]}")
        return STATE_WORK / out

    ok = True
    try:
        for kv in ("f16", "q8_0"):
            dump("first", kv, f"first-{kv}")
            dump("tip", kv, f"tip-{kv}")
            dump("first", kv, f"tip-via-first-{kv}", f"tip-{kv}")
            dump("tip", kv, f"first-via-tip-{kv}", f"first-{kv}")
            for part, what in (("seq", "sequence state"), ("ctx", "context state")):
                n = (STATE_WORK / f"tip-{kv}.{part}").stat().st_size
                back = [differing(STATE_WORK / f"{a}-via-{b}-{kv}.{part}", STATE_WORK / f"{a}-{kv}.{part}")[0]
                        for a, b in (("tip", "first"), ("first", "tip"))]
                fresh, at = differing(STATE_WORK / f"first-{kv}.{part}", STATE_WORK / f"tip-{kv}.{part}")
                same_size = (STATE_WORK / f"first-{kv}.{part}").stat().st_size == n
                holds = back == [0, 0] and (fresh == 0 or (kv != "f16" and same_size))
                ok &= holds
                trip = "identical both ways" if back == [0, 0] else f"{back} bytes differ"
                if fresh == 0:
                    saved = "identical"
                elif same_size:
                    saved = f"{fresh} bytes differ, the first at offset {at} (the same size)"
                else:
                    saved = "of other sizes"
                print(f"state bytes, plain {kv} {what} ({n} bytes): read by the other build and written "
                      f"back: {trip}; saved fresh: {saved}{'' if holds else ' FAIL'}", flush=True)
    except build.BuildError as err:
        print(f"check_series: {err}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def record(steps: list[Step], started: datetime.datetime, seconds: float) -> None:
    """The summary of a full run into native/README.md, between the markers (appended the first time)."""
    failed = [s for s in steps if s.result != "ok"]
    verdict = "every prefix builds and passes its tests" if not failed else \
        "; ".join(f"{s.patch.name[:4]} {s.result}" for s in failed)
    text = (f"{RECORD_START}\nLast full run of `native/check_series.py`: {started:%Y-%m-%d %H:%M} UTC, "
            f"{seconds / 60:.0f} min, {len(steps)} prefixes: {verdict}. {device_summary(steps)}\n"
            f"{RECORD_END}")
    readme = README.read_text()
    if RECORD_START in readme and RECORD_END in readme:
        head, rest = readme.split(RECORD_START, 1)
        readme = head + text + rest.split(RECORD_END, 1)[1]
    else:
        readme = readme.rstrip("\n") + "\n\n## Bisectability\n\n" + text + "\n"
    README.write_text(readme)


def device_summary(steps: list[Step]) -> str:
    """One sentence on the GPU code of the prefixes that touch it: where it compiled, where it could not."""
    notes = [f"{s.patch.name[:4]} {note}" for s in steps for note in s.notes]
    if not notes:
        return "No prefix touches GPU code."
    return "GPU code: " + "; ".join(notes) + "."


def main(argv: list[str] | None = None) -> int:
    global SERIES_SRC
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="first", type=int, default=1, help="first patch number (default 1)")
    parser.add_argument("--to", dest="last", type=int, default=10_000, help="last patch (default: all)")
    parser.add_argument("--jobs",
                        default=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2)))
    parser.add_argument("--keep-going", action="store_true", help="go on after a failing prefix")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (patches, tests) and stop")
    parser.add_argument("--record", action="store_true", help="write a full run's summary into README.md")
    parser.add_argument("--worktree", type=Path, default=SERIES_SRC,
                        help="where the prefixes are applied (another worktree runs beside a running check)")
    parser.add_argument("--devices-only", action="store_true",
                        help="only compile the GPU code of the prefixes that touch it (no libllama or tests)")
    parser.add_argument("--state-bytes", action="store_true",
                        help="after a full run: a plain cache's states of the rotation-record prefix's build "
                             "against the tip's, byte for byte")
    args = parser.parse_args(argv)
    SERIES_SRC = args.worktree.resolve()
    if args.state_bytes:
        return state_bytes(args.jobs)

    steps = plan(args.first, args.last)
    if not steps:
        print("check_series: no patch in that range", file=sys.stderr)
        return 2
    if args.devices_only:
        steps = [s for s in steps if s.devices]
        if not steps:
            print("check_series: no patch in that range touches GPU code", file=sys.stderr)
            return 2
    if args.dry_run:
        for s in steps:
            devices = "; ".join(f"compile {b} ({', '.join(f)})" for b, f in s.devices.items())
            if args.devices_only:
                print(f"{s.patch.name}: {devices}")
                continue
            print(f"{s.patch.name}: build llama, ggml{''.join(', ' + t for t in s.tests)}"
                  f"{'; run ' + ', '.join(s.tests) if s.tests else ''}{'; ' + devices if devices else ''}")
        return 0

    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    log = NATIVE / "work" / ("check_series-devices.log" if args.devices_only else "check_series.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"check_series {started:%Y-%m-%d %H:%M:%S} UTC\n")
    try:
        reset_worktree(steps[0].index - 1)
    except build.BuildError as err:
        print(f"check_series: {err}", file=sys.stderr)
        return 1

    applied = steps[0].index - 1
    for step in steps:
        t = time.monotonic()
        # --devices-only skips the prefixes between: they are applied without a build
        ok = all(apply(p) for p in build.patch_files()[applied:step.index])
        applied = step.index
        step.result = build_and_test(step, args.jobs, log, args.devices_only) if ok else "does not apply"
        step.seconds = time.monotonic() - t
        notes = f" [{'; '.join(step.notes)}]" if step.notes else ""
        print(f"{step.patch.name}: {step.result} ({step.seconds:.0f} s){notes}", flush=True)
        if step.result != "ok" and (not args.keep_going or step.result == "does not apply"):
            break

    seconds = time.monotonic() - t0
    ran = [s for s in steps if s.result != "not run"]
    ok = all(s.result == "ok" for s in steps)
    n_ok = sum(s.result == "ok" for s in ran)
    print(f"check_series: {n_ok} of {len(steps)} prefixes ok in {seconds / 60:.0f} min; "
          f"{device_summary(steps)} log: {log}")
    if args.record and not args.devices_only and args.first == 1 and args.last >= len(build.patch_files()):
        record(steps, started, seconds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
