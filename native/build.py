#!/usr/bin/env python3
"""Build the patched llama-cpp-python engine for LazyKV Chat.

The engine is the pinned llama-cpp-python sdist plus the patch series in
``native/patches``.  Subcommands:

  prepare   fetch + verify the sdist, extract it into native/work/src as a git
            repo at the pristine state, apply the patch series (git am)
  build     build the wheel with scikit-build-core into the wheel cache,
            reusing the persistent CMake build dir native/work/build
  export    regenerate native/patches from the commits in the work tree
  dev       build the work tree as it is and install it (version
            0.3.36+lazykv.dev, never cached): the edit loop
  ensure    wheel from the cache (or prepare + build), installed into the
            running interpreter's environment; does nothing when current
  key       print the cache key and the wheel version
  wheel     print the path of the cached wheel (built first when missing), installing nothing:
            with LAZYKV_BACKEND, another backend's engine beside this one (``make vulkan-check``)
  backend   print the backend the build is for (cpu, cuda, vulkan, metal) and why, one line
  tools     build llama.cpp's test and tool programs (test-llama-archs,
            test-save-load-state, test-backend-ops, test-jinja, llama-perplexity,
            llama-bench, ggml-rpc-server) of the exported series into the tools cache,
            and convert-rows-cuda-sim (ggml-cuda's conversion kernel run on the host,
            native/gpu_check/cuda_sim); print their directory; does nothing when current

The backend follows the machine's GPU, not the tools alone (``detect_backend``):
CUDA when the driver lists a GPU (``nvidia-smi -L``, else libcuda) and ``nvcc``
or ``CUDA_HOME`` is there to build with; Vulkan when ``vulkaninfo`` lists a GPU
that is not Mesa's CPU device (lavapipe) and ``glslc``, the Vulkan headers and
the loader are installed; Metal on macOS arm64; the CPU otherwise (a toolkit
without a GPU builds for the CPU).  ``LAZYKV_BACKEND=cpu|cuda|vulkan|metal``
chooses it, and a ``-DGGML_CUDA/VULKAN/METAL=ON`` in ``CMAKE_ARGS`` wins over both.

The wheel cache lives in $XDG_CACHE_HOME/lazykv/engine (~/.cache/lazykv/engine)
and is keyed by the sha256 of (sdist sha256, patch bytes, CMAKE_ARGS, Python
tag, machine, and the backend unless it is the CPU), so a second run never
rebuilds; a GPU wheel's version says its backend (``0.3.36+lazykv.<series>.cuda``).
The tools live beside it in $XDG_CACHE_HOME/lazykv/tools/<key>, keyed the same way by their own CMake
arguments and the simulator's sources; they are built from a git worktree of the exported series
(native/work/tools-src, build dir native/work/build-tools), never from the
edit tree, so uncommitted work never lands in the cache.  Only the standard library is
used: this runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

SDIST_NAME = "llama_cpp_python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_FILE = f"{SDIST_NAME}-{SDIST_VERSION}.tar.gz"

NATIVE = Path(__file__).resolve().parent
PATCHES = NATIVE / "patches"
WORK = NATIVE / "work"
SRC = WORK / "src"
BUILD_DIR = WORK / "build"  # the CPU build's; a GPU backend builds in build-<backend> (build_dir())
PRISTINE_TAG = "pristine"
SERIES_MARK = ".lazykv-series"  # in SRC/.git: hash of the series applied

# Only what the Python bindings need (and the RPC server): no other tools, tests, server or mtmd.
BASE_CMAKE_ARGS = [
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    # the RPC backend and its server (shipped in the wheel): offload to another machine, and the
    # non-host backend the device-memory tests run on
    "-DGGML_RPC=ON",
    # a KV cache converted in place streams over its buffer: 2 MiB pages (Linux; ggml's opt-in)
    "-DGGML_CPU_HUGE_PAGES=ON",
]
# x86-64: a fixed AVX2/FMA/F16C baseline instead of -march=native. The wheel is
# then the same on every laptop of the last decade, and -march=native would also
# enable AMX, whose tile instructions raise SIGILL where the kernel/VM does not
# grant them (seen on this project's CI machines).
X86_64_CMAKE_ARGS = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
]

TOOLS_SRC = WORK / "tools-src"
TOOLS_BUILD_DIR = WORK / "build-tools"
# static, so that the cached programs run without the build tree
TOOLS_CMAKE_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_RPC=ON",
    "-DGGML_CPU_HUGE_PAGES=ON",
]
TOOLS = ("test-llama-archs", "test-save-load-state", "test-backend-ops", "test-jinja", "test-kv-lazy",
         "llama-perplexity", "llama-bench", "ggml-rpc-server")
# ggml-cuda's conversion kernel run on the host against the CPU backend (native/gpu_check/cuda_sim), built
# beside the tools from the same sources and libraries
CUDA_SIM_DIR = NATIVE / "gpu_check" / "cuda_sim"
CUDA_SIM_TOOL = "convert-rows-cuda-sim"

GIT_ID = ["-c", "user.name=LazyKV build", "-c", "user.email=build@lazykv.invalid"]


class BuildError(RuntimeError):
    pass


# ---------------------------------------------------------------- backend

BACKENDS = ("cpu", "cuda", "vulkan", "metal")
BACKEND_CMAKE_ARGS = {"cpu": [], "cuda": ["-DGGML_CUDA=ON"], "vulkan": ["-DGGML_VULKAN=ON"],
                      "metal": ["-DGGML_METAL=ON"]}
PROBE_TIMEOUT_S = 10.0
# where the Vulkan headers and loader are looked for besides $VULKAN_SDK (tests replace these)
VULKAN_INCLUDE_DIRS = [Path("/usr/include"), Path("/usr/local/include")]
VULKAN_LIBRARY_DIRS = [Path("/usr/lib"), Path("/usr/lib64"), Path("/usr/local/lib"),
                       Path(f"/usr/lib/{platform.machine()}-linux-gnu")]


@dataclass(frozen=True)
class Backend:
    name: str  # one of BACKENDS
    reason: str  # why, in words

    def line(self) -> str:
        return f"{self.name}: {self.reason}"


def _probe(cmd: list[str]) -> str | None:
    """The output of a probing command, None when it is missing, fails or hangs."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def libcuda_device_count() -> int:
    """The CUDA devices the driver library reports (0 without a driver or a device)."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except (OSError, AttributeError):
        return 0


def cuda_gpus() -> tuple[int, str]:
    """How many NVIDIA GPUs the driver sees, and how that was found out."""
    listed = _probe(["nvidia-smi", "-L"])
    if listed is not None:
        gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
        if gpus:
            return len(gpus), f"nvidia-smi -L lists {len(gpus)} GPU(s)"
    count = libcuda_device_count()
    if count:
        return count, f"libcuda reports {count} device(s)"
    how = "nvidia-smi lists none" if listed is not None else "no nvidia-smi"
    return 0, f"no CUDA GPU ({how}, libcuda reports none)"


def cuda_compiler() -> str | None:
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return f"CUDA_HOME={home}" if home and Path(home).is_dir() else None


def vulkan_gpus() -> tuple[list[str], str]:
    """The Vulkan devices that are GPUs (not a CPU implementation: lavapipe), and how that was found."""
    summary = _probe(["vulkaninfo", "--summary"])
    if summary is None:
        return [], "no Vulkan device (no vulkaninfo)"
    devices: list[dict[str, str]] = []
    for raw in summary.splitlines():
        line = raw.strip()
        if line.startswith("GPU") and line.endswith(":") and line[3:-1].isdigit():
            devices.append({})
        elif devices and "=" in line:
            key, _, value = line.partition("=")
            devices[-1][key.strip()] = value.strip()
    gpus = [d.get("deviceName", "?") for d in devices
            if d.get("deviceType", "").upper() not in ("", "PHYSICAL_DEVICE_TYPE_CPU")
            and "llvmpipe" not in d.get("deviceName", "").lower()]
    if gpus:
        return gpus, f"Vulkan GPU {', '.join(gpus)}"
    if devices:
        names = ", ".join(d.get("deviceName", "?") for d in devices)
        return [], f"no Vulkan GPU (only a CPU device: {names})"
    return [], "no Vulkan device (vulkaninfo lists none)"


def vulkan_toolchain() -> list[str]:
    """What building for Vulkan lacks: glslc, the headers, the loader ([] when all are there)."""
    sdk = os.environ.get("VULKAN_SDK")
    includes = ([Path(sdk) / "include"] if sdk else []) + VULKAN_INCLUDE_DIRS
    libs = ([Path(sdk) / "lib", Path(sdk) / "Lib"] if sdk else []) + VULKAN_LIBRARY_DIRS
    missing = []
    if not shutil.which("glslc"):
        missing.append("glslc")
    if not any((d / "vulkan" / "vulkan.h").is_file() for d in includes):
        missing.append("the Vulkan headers")
    loaders = ("libvulkan.so", "libvulkan.dylib", "vulkan-1.lib")  # Linux, macOS (MoltenVK), Windows SDK
    if not any((d / name).is_file() for d in libs for name in loaders):
        missing.append("the Vulkan loader (libvulkan.so)")
    return missing


def _cmake_backend(args: list[str]) -> str | None:
    """The backend a ``-DGGML_<X>=ON`` in CMAKE_ARGS asks for (the last one), else None."""
    chosen = None
    for arg in args:
        key, _, value = arg.partition("=")
        for name in ("cuda", "vulkan", "metal"):
            if key.upper() == f"-DGGML_{name.upper()}" and value.upper() in ("ON", "1", "TRUE", "YES"):
                chosen = name
    return chosen


def detect_backend() -> Backend:
    """The backend to build for on this machine (see the module docstring)."""
    from_cmake = _cmake_backend(os.environ.get("CMAKE_ARGS", "").split())
    if from_cmake:
        return Backend(from_cmake, f"CMAKE_ARGS asks for it ({os.environ['CMAKE_ARGS'].strip()})")
    forced = os.environ.get("LAZYKV_BACKEND", "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise BuildError(f"LAZYKV_BACKEND={forced!r} is not one of {', '.join(BACKENDS)}")
        return Backend(forced, f"LAZYKV_BACKEND={forced}")
    if sys.platform == "darwin" and platform.machine().lower() in ("arm64", "aarch64"):
        return Backend("metal", "macOS on Apple silicon")
    notes = []
    n_cuda, cuda_how = cuda_gpus()
    nvcc = cuda_compiler()
    if n_cuda and nvcc:
        return Backend("cuda", f"{cuda_how}, builds with {nvcc}")
    if n_cuda:
        notes.append(f"{cuda_how} but no nvcc or CUDA_HOME to build with")
    elif nvcc:
        notes.append(f"{nvcc} is installed but {cuda_how}")
    else:
        notes.append(cuda_how)
    gpus, vulkan_how = vulkan_gpus()
    lacking = vulkan_toolchain() if gpus else []
    if gpus and not lacking:
        return Backend("vulkan", f"{vulkan_how}, glslc, headers and loader installed")
    notes.append(f"{vulkan_how} but no {', '.join(lacking)} to build with" if gpus else vulkan_how)
    return Backend("cpu", "; ".join(notes))


def backend() -> Backend:
    """The backend of this build, detected once per process."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = detect_backend()
    return _BACKEND


_BACKEND: Backend | None = None


def log(msg: str) -> None:
    print(f"[engine] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lazykv"


def run(cmd: list[str], cwd: Path | None = None, check: bool = True,
        capture: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, check=check, text=True, env=env,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)


def git(*args: str, capture: bool = True, check: bool = True) -> str:
    res = run(["git", *GIT_ID, *args], cwd=SRC, capture=capture, check=False)
    if check and res.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed:\n{res.stdout or ''}")
    return (res.stdout or "").strip()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def patch_files() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def series_hash() -> str:
    """Hash of the patch series: names and bytes, in order."""
    h = hashlib.sha256()
    for p in patch_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cmake_args() -> list[str]:
    args = list(BASE_CMAKE_ARGS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        args += X86_64_CMAKE_ARGS
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    user = os.environ.get("CMAKE_ARGS", "").split()
    chosen = backend().name
    detected = [] if _cmake_backend(user) else BACKEND_CMAKE_ARGS[chosen]
    return args + detected + user


def python_tag() -> str:
    return f"{sys.implementation.name}{sys.version_info.major}{sys.version_info.minor}"


def wheel_version() -> str:
    """``0.3.36+lazykv.<series>``, and ``.<backend>`` after it for a GPU backend (the CPU's has none)."""
    name = backend().name
    return f"{SDIST_VERSION}+lazykv.{series_hash()[:10]}" + ("" if name == "cpu" else f".{name}")


def cache_key() -> str:
    """The CPU backend's key hashes exactly what it did before backends were detected (no rebuild)."""
    h = hashlib.sha256()
    parts = [SDIST_SHA256, series_hash(), " ".join(os.environ.get("CMAKE_ARGS", "").split()),
             python_tag(), platform.machine(), " ".join(BASE_CMAKE_ARGS + X86_64_CMAKE_ARGS)]
    if backend().name != "cpu":
        parts.append(f"backend={backend().name}")
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def wheel_cache_dir() -> Path:
    return cache_root() / "engine" / cache_key()


def cached_wheel() -> Path | None:
    wheels = sorted(wheel_cache_dir().glob("*.whl"))
    return wheels[0] if wheels else None


# ---------------------------------------------------------------- prepare

def fetch_sdist() -> Path:
    dest = cache_root() / "sdist"
    path = dest / SDIST_FILE
    if path.exists() and sha256_file(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading {SDIST_NAME}=={SDIST_VERSION} (sdist)")
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             "--no-build-isolation", "--quiet", "-d", tmp, f"{SDIST_NAME}=={SDIST_VERSION}"])
        got = Path(tmp) / SDIST_FILE
        if not got.exists():
            raise BuildError(f"pip download did not produce {SDIST_FILE}")
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise BuildError(f"sdist sha256 mismatch: expected {SDIST_SHA256}, got {digest}")
        got.replace(path)
    return path


def extract_pristine(sdist: Path) -> None:
    log(f"extracting {sdist.name} into {SRC}")
    if SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        top = f"{SDIST_NAME}-{SDIST_VERSION}/"
        for member in tar.getmembers():
            if not member.name.startswith(top):
                continue
            member.name = member.name[len(top):]
            if not member.name:
                continue
            tar.extract(member, SRC, filter="data")
    # The sdist ships llama-cpp-python's own .git and a submodule pointer: drop them.
    shutil.rmtree(SRC / ".git", ignore_errors=True)
    (SRC / "vendor" / "llama.cpp" / ".git").unlink(missing_ok=True)
    git("init", "-q", "-b", "lazykv")
    git("add", "-A", "-f")
    git("commit", "-q", "--no-verify", "-m", f"pristine {SDIST_NAME} {SDIST_VERSION} sdist")
    git("tag", PRISTINE_TAG)


def applied_series() -> str | None:
    mark = SRC / ".git" / SERIES_MARK
    return mark.read_text().strip() if mark.exists() else None


def apply_series() -> None:
    git("reset", "-q", "--hard", PRISTINE_TAG)
    for patch in patch_files():
        res = run(["git", *GIT_ID, "am", "-q", "--keep-cr", "--committer-date-is-author-date",
                   str(patch)], cwd=SRC, capture=True, check=False)
        if res.returncode != 0:
            run(["git", "am", "--abort"], cwd=SRC, capture=True, check=False)
            raise BuildError(f"patch {patch.name} does not apply:\n{res.stdout}\n{rejected_hunks(patch)}")
        log(f"applied {patch.name}")
    (SRC / ".git" / SERIES_MARK).write_text(series_hash() + "\n")


def rejected_hunks(patch: Path) -> str:
    """Apply with --reject to show exactly which hunks fail, then clean up."""
    res = run(["git", "apply", "--reject", "--verbose", str(patch)], cwd=SRC, capture=True, check=False)
    rejects = []
    for rej in SRC.rglob("*.rej"):
        rejects.append(f"--- rejected hunk(s) in {rej.relative_to(SRC)}:\n{rej.read_text()}")
    git("reset", "-q", "--hard")
    git("clean", "-q", "-fdx", "-e", "!llama_cpp/lib")
    return res.stdout + "\n".join(rejects)


def ensure_pristine() -> bool:
    """Make SRC a git repo holding the pristine sdist (tag ``pristine``); True if it was just extracted."""
    if (SRC / ".git").exists() and git("tag", "-l", PRISTINE_TAG, check=False):
        return False
    ensure_build_requirements()
    extract_pristine(fetch_sdist())
    return True


def prepare(force: bool = False) -> None:
    if ensure_pristine():
        pass
    elif not force and applied_series() == series_hash():
        log("work tree already has the current patch series")
        return
    if git("status", "--porcelain", "--untracked-files=no"):
        raise BuildError(f"{SRC} has uncommitted changes: commit and `export` them, or discard them")
    apply_series()


# ---------------------------------------------------------------- build

def ensure_build_requirements() -> None:
    missing = []
    for req, mod in (("scikit-build-core>=0.10", "scikit_build_core"), ("cmake>=3.21", "cmake"),
                     ("ninja", "ninja")):
        try:
            metadata.version(mod.replace("_", "-"))
        except metadata.PackageNotFoundError:
            missing.append(req)
    if missing:
        log(f"installing build requirements: {' '.join(missing)}")
        run([sys.executable, "-m", "pip", "install", "--quiet", *missing])


def build_dir() -> Path:
    """The persistent CMake build directory of this backend: switching backends does not rebuild the other."""
    name = backend().name
    return BUILD_DIR if name == "cpu" else WORK / f"build-{name}"


def build(dev: bool = False) -> Path:
    """Build the wheel of the exported series into the cache; dev: of the work tree as it is, uncached."""
    if not dev:
        prepare()
    ensure_build_requirements()
    init_py = SRC / "llama_cpp" / "__init__.py"
    original = init_py.read_text()
    version = f"{SDIST_VERSION}+lazykv.dev" if dev else wheel_version()
    init_py.write_text(original.replace(f'__version__ = "{SDIST_VERSION}"', f'__version__ = "{version}"'))
    out = cache_root() / "engine-dev" if dev else wheel_cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(cmake_args()))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    log(f"building {SDIST_NAME} {version} (CMAKE_ARGS={env['CMAKE_ARGS']})")
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--quiet", "-w", tmp, f"--config-settings=build-dir={build_dir()}", str(SRC)], env=env)
            wheels = list(Path(tmp).glob("*.whl"))
            if len(wheels) != 1:
                raise BuildError(f"expected one wheel, got {wheels}")
            target = out / wheels[0].name
            wheels[0].replace(target)
    finally:
        init_py.write_text(original)
    log(f"built {target.name} in {time.monotonic() - t0:.0f} s")
    if not dev:
        prune_wheel_cache(keep=out)
    return target


def prune_wheel_cache(keep: Path, n_keep: int = 4) -> None:
    """Keep the newest few cached wheels (e.g. for switching branches), drop the rest."""
    entries = sorted((p for p in keep.parent.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in entries[:-n_keep]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def install_wheel(wheel: Path) -> None:
    run([sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel)])


def installed_version() -> str | None:
    try:
        return metadata.version(SDIST_NAME)
    except metadata.PackageNotFoundError:
        return None


def ensure() -> None:
    version = wheel_version()
    log(f"backend {backend().line()}")
    if installed_version() == version and cached_wheel() is not None:
        log(f"engine {version} ({backend().name}) is installed")
        return
    wheel = cached_wheel()
    if wheel is None:
        wheel = build()
    else:
        log(f"using cached wheel {wheel}")
    install_wheel(wheel)
    # the engine's own runtime dependencies, without touching the engine
    run([sys.executable, "-m", "pip", "install", "--quiet", "numpy>=1.20.0", "diskcache>=5.6.1",
         "jinja2>=2.11.3", "typing-extensions>=4.5.0"])
    log(f"installed engine {version} ({backend().name})")


# ---------------------------------------------------------------- tools

def tools_cmake_args() -> list[str]:
    args = list(TOOLS_CMAKE_ARGS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        args += X86_64_CMAKE_ARGS
    return args + os.environ.get("CMAKE_ARGS", "").split()


def touches_llama_cpp(patch: Path) -> bool:
    """Whether a patch changes llama.cpp's tree (``vendor/llama.cpp``), not only llama-cpp-python's."""
    return any(line.startswith("diff --git a/vendor/llama.cpp/")
               for line in patch.read_text(encoding="utf-8", errors="replace").splitlines())


def llama_cpp_series_hash() -> str:
    """Hash of the patches that change llama.cpp: the tools are built from llama.cpp alone, so a
    patch to the Python package does not rebuild them."""
    h = hashlib.sha256()
    for p in patch_files():
        if touches_llama_cpp(p):
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def tools_key() -> str:
    h = hashlib.sha256()
    for part in (SDIST_SHA256, llama_cpp_series_hash(), " ".join(tools_cmake_args()), platform.machine()):
        h.update(part.encode() + b"\0")
    for p in sorted(CUDA_SIM_DIR.iterdir()):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def tools_dir() -> Path:
    """Where ``tools`` puts the programs of the current series (they may not be built yet)."""
    return cache_root() / "tools" / tools_key()


def tools_source() -> Path:
    """A worktree of SRC's repo at the pristine sdist with the exported series applied."""
    ensure_pristine()
    mark = WORK / "tools-src.series"
    if TOOLS_SRC.exists() and mark.exists() and mark.read_text().strip() == series_hash():
        return TOOLS_SRC
    mark.unlink(missing_ok=True)
    # back to pristine in place when possible: only the files the series touches change, so the
    # tools build dir rebuilds only what depends on them
    if TOOLS_SRC.exists():
        run(["git", "am", "--abort"], cwd=TOOLS_SRC, capture=True, check=False)
    in_place = TOOLS_SRC.exists() and run(["git", "reset", "-q", "--hard", PRISTINE_TAG], cwd=TOOLS_SRC,
                                          capture=True, check=False).returncode == 0
    if not in_place:
        shutil.rmtree(TOOLS_SRC, ignore_errors=True)
        git("worktree", "prune")
        git("worktree", "add", "-q", "--detach", str(TOOLS_SRC), PRISTINE_TAG)
    for patch in patch_files():
        res = run(["git", *GIT_ID, "am", "-q", "--keep-cr", "--committer-date-is-author-date", str(patch)],
                  cwd=TOOLS_SRC, capture=True, check=False)
        if res.returncode != 0:
            raise BuildError(f"patch {patch.name} does not apply to the tools tree:\n{res.stdout}")
    mark.write_text(series_hash() + "\n")
    return TOOLS_SRC


def cuda_sim_source(llama_cpp_src: Path, dest: Path) -> None:
    """ggml-cuda/convert-rows.cu for cuda_sim.h: its launches as cuda_sim_launch calls, the fastdiv helpers of
    common.cuh before it instead of its header."""
    cu = (llama_cpp_src / "ggml" / "src" / "ggml-cuda" / "convert-rows.cu").read_text()
    common = (llama_cpp_src / "ggml" / "src" / "ggml-cuda" / "common.cuh").read_text()
    fastdiv = re.search(r"static const uint3 init_fastdiv_values\(.*?\n(?=\S[^\n]*dequantize_kernel_t)",
                        common, re.S)
    launch = re.compile(r"(\w+<[^<>;]*>)<<<([^,]+),\s*([^,]+),\s*[^,]+,\s*[^>]+>>>\(([^;]*)\);")
    if fastdiv is None or '#include "convert-rows.cuh"' not in cu or len(launch.findall(cu)) != 1:
        raise BuildError("convert-rows.cu or common.cuh changed: update cuda_sim_source() in native/build.py")
    cu = cu.replace('#include "convert-rows.cuh"', '#include "cuda_sim.h"\n\n' + fastdiv.group(0), 1)
    cu = launch.sub(r"cuda_sim_launch(\1, \2, \3, \4);", cu)
    # __shared__ T name[a][b]; as T (&name)[a][b] = cuda_sim::block_shared<T[a][b]>(i), i counting them per
    # kernel
    shared = re.compile(r"__shared__\s+(\w+)\s+(\w+)((?:\[[^\]]+\])+);")
    counts: dict[str, int] = {}

    def block_shared(m: re.Match) -> str:
        kernel = cu.rfind("__global__", 0, m.start())
        i = counts[kernel] = counts.get(kernel, -1) + 1
        return f"{m[1]} (&{m[2]}){m[3]} = cuda_sim::block_shared<{m[1]}{m[3]}>({i});"
    dest.write_text(shared.sub(block_shared, cu))


def build_cuda_sim(llama_cpp_src: Path, out: Path) -> None:
    """CUDA_SIM_TOOL into out, linked with the tools build's static ggml."""
    libs = TOOLS_BUILD_DIR / "ggml" / "src"
    with tempfile.TemporaryDirectory() as tmp:
        cuda_sim_source(llama_cpp_src, Path(tmp) / "convert-rows.sim.cu")
        run([os.environ.get("CXX", "c++"), "-std=c++17", "-O1", "-ffp-contract=off", "-Wall",
             "-Wno-unknown-pragmas", "-Wno-unused-function", "-I", tmp, "-I", str(CUDA_SIM_DIR),
             "-I", str(llama_cpp_src / "ggml" / "include"), "-I", str(llama_cpp_src / "ggml" / "src"),
             '-DCONVERT_ROWS_SIM_SOURCE="convert-rows.sim.cu"', str(CUDA_SIM_DIR / "convert_rows_sim.cpp"),
             str(libs / "libggml.a"), str(libs / "libggml-cpu.a"), str(libs / "libggml-base.a"),
             "-fopenmp", "-lpthread", "-o", str(out / CUDA_SIM_TOOL)])


def build_tools() -> Path:
    """The directory holding TOOLS for the current series, built (minutes) only when not cached."""
    out = tools_dir()
    if all((out / name).is_file() for name in (*TOOLS, CUDA_SIM_TOOL)):
        return out
    llama_cpp_src = tools_source() / "vendor" / "llama.cpp"
    ensure_build_requirements()
    log(f"building {', '.join(TOOLS)} (cmake {' '.join(tools_cmake_args())})")
    t0 = time.monotonic()
    res = run(["cmake", "-S", str(llama_cpp_src), "-B", str(TOOLS_BUILD_DIR), "-G", "Ninja",
               *tools_cmake_args()], capture=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"cmake could not configure the tools build:\n{res.stdout}")
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    run(["cmake", "--build", str(TOOLS_BUILD_DIR), "-j", jobs, "--target", *TOOLS])
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent))
    staging.chmod(0o755)
    for name in TOOLS:
        shutil.copy2(TOOLS_BUILD_DIR / "bin" / name, staging / name)
    build_cuda_sim(llama_cpp_src, staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    log(f"built the tools in {time.monotonic() - t0:.0f} s into {out}")
    prune_wheel_cache(keep=out, n_keep=2)  # the state suite keeps ~1 GB of models beside them
    return out


# ---------------------------------------------------------------- export

def export() -> None:
    if git("status", "--porcelain", "--untracked-files=no"):
        raise BuildError(f"{SRC} has uncommitted changes: commit them first")
    with tempfile.TemporaryDirectory() as tmp:
        run(["git", "format-patch", "-q", "-N", "--zero-commit", "--no-signature", "--no-stat",
             "--full-index", "-o", tmp, f"{PRISTINE_TAG}..HEAD"], cwd=SRC)
        new = sorted(Path(tmp).glob("*.patch"))
        for old in patch_files():
            old.unlink()
        PATCHES.mkdir(exist_ok=True)
        for p in new:
            shutil.copy(p, PATCHES / p.name)
    (SRC / ".git" / SERIES_MARK).write_text(series_hash() + "\n")
    log(f"exported {len(new)} patch(es); wheel version now {wheel_version()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_prep = sub.add_parser("prepare", help="extract the sdist and apply the patch series")
    p_prep.add_argument("--force", action="store_true", help="re-apply even if up to date")
    sub.add_parser("build", help="build the wheel into the cache")
    sub.add_parser("dev", help="build the work tree as it is (uncommitted edits too), install it, uncached")
    sub.add_parser("export", help="regenerate native/patches from the work tree commits")
    sub.add_parser("ensure", help="install the engine wheel (cached or freshly built)")
    sub.add_parser("key", help="print the cache key and wheel version")
    sub.add_parser("wheel", help="print the cached wheel's path (built when missing), install nothing")
    sub.add_parser("backend", help="print the backend this machine builds for and why, one line")
    sub.add_parser("tools", help="build llama.cpp's test/tool programs into the tools cache, print its path")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "prepare":
            prepare(force=args.force)
        elif args.cmd == "build":
            print(build())
        elif args.cmd == "dev":
            install_wheel(build(dev=True))
        elif args.cmd == "export":
            export()
        elif args.cmd == "ensure":
            ensure()
        elif args.cmd == "key":
            print(cache_key(), wheel_version())
        elif args.cmd == "wheel":
            print(cached_wheel() or build())
        elif args.cmd == "backend":
            print(backend().line())
        elif args.cmd == "tools":
            print(build_tools())
    except (BuildError, subprocess.CalledProcessError) as err:
        print(f"native/build.py {args.cmd}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
