"""Device section of ``make bench``: the lazy cache on a non-host backend (llama.cpp's RPC backend).

``python -m bench.device`` compiles native/gpu_check/lazy_check.cpp (the program ``make gpu-check``
runs on a GPU) against the installed engine, starts the engine's ``ggml-rpc-server`` on 127.0.0.1 and
runs the program with every layer and the KV cache on that server: the f16 phase against an f16 cache,
KLD after the breakpoint, a conversion behind unread decodes, the conversion pause against a
device-to-device copy of the f16 view's bytes in the same run and against its wall cost (lazy decode
minus the same q8_0 decode), and decode speed at two depths. Writes bench/results/device.md.

On RPC a "device" is the server's CPU behind a socket: the ratios say what the device path costs where
the cache is not in this process's memory; bench/results/gpu_check_h200.md has the same program on an
NVIDIA H200.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "device.md"
SOURCE = ROOT / "native" / "gpu_check" / "lazy_check.cpp"
HEADERS = ROOT / "native" / "work" / "src" / "vendor" / "llama.cpp"
N_CTX = 2048


def compile_check(out: Path) -> Path:
    """lazy_check built against the installed engine's libraries (headers of the prepared sources)."""
    if not (HEADERS / "include" / "llama.h").is_file():
        subprocess.run([sys.executable, str(ROOT / "native" / "build.py"), "prepare"], check=True)
    lib = Path(llama_cpp.__file__).parent / "lib"
    exe = out / "lazy-check"
    subprocess.run(
        [
            "c++",
            "-O2",
            "-std=c++17",
            str(SOURCE),
            "-I",
            str(HEADERS / "include"),
            "-I",
            str(HEADERS / "ggml" / "include"),
            "-L",
            str(lib),
            "-l:libllama.so.0",
            "-l:libggml.so.0",
            "-l:libggml-base.so.0",
            f"-Wl,-rpath,{lib}",
            "-o",
            str(exe),
        ],
        check=True,
    )
    return exe


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(llama_cpp.rpc_server_path()), "-H", "127.0.0.1", "-p", str(port), "-t", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("ggml-rpc-server did not start")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_check(Path(tmp))
        proc, endpoint = start_server()
        try:
            run = subprocess.run(
                [str(exe), str(Path(tmp) / "model.gguf"), str(N_CTX), endpoint],
                capture_output=True,
                text=True,
                timeout=3600,
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    if run.returncode not in (0, 1):
        print(run.stderr[-4000:], file=sys.stderr)
        return run.returncode
    RESULTS.write_text(
        "<!-- python -m bench.device (make bench): lazy_check.cpp on a local ggml-rpc-server -->\n"
        + run.stdout,
        encoding="utf-8",
    )
    print(run.stdout)
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
