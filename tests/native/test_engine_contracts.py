"""Engine contracts of issue 25, section 3: the progress callback, and an RPC server that dies.

- The lazy cache's progress callback is called outside the engine's locks: it may call back into
  llama (the memory use, the lazy info) and replace itself; replacing it from another thread
  returns once the running call has returned.
- A dead RPC server does not end the application: a decode or a conversion on it fails with an
  error (llama_decode's return code, through the graph computation's status) and the log says which
  server stopped answering. A decode already queued when the server stops returns before its outputs
  are owed, so the failure may come with the next one; nothing is zero-filled as if it were data. Run
  in a child process, since before the fix the process aborted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import llama_cpp
import pytest

from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

from .helpers import make_llama, random_tokens

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "synthetic-hd64.gguf"
    return write_llama_gguf(path, SyntheticShape(head_dim=64, n_head=4, n_head_kv=2))


def test_progress_callback_reads_memory_and_replaces_itself(model_file: Path) -> None:
    llm = make_llama(model_file, "lazy", n_ctx=1024)
    calls: list[str] = []
    seen: list[tuple[int, int]] = []

    def second(info: llama_cpp.KvLazyInfo) -> None:
        calls.append("second")

    def first(info: llama_cpp.KvLazyInfo) -> None:
        calls.append("first")
        # back into llama from inside the callback: the memory use and the lazy info
        seen.append((sum(u.kv for u in llm.memory_breakdown()), llm.kv_lazy_info().kv_bytes))
        llm.set_kv_lazy_progress_callback(second)

    llm.set_kv_lazy_progress_callback(first)
    llm.eval(random_tokens(1, 600))  # past the f16 view of 512 cells: one conversion
    assert llm.kv_lazy_info().phase == "q8_0"
    assert calls[0] == "first" and calls[1:] and set(calls[1:]) == {"second"}, calls
    assert seen[0][0] == seen[0][1] > 0


def test_progress_callback_replaced_from_another_thread_waits_for_the_running_call(model_file: Path) -> None:
    llm = make_llama(model_file, "lazy", n_ctx=1024)
    running = threading.Event()
    release = threading.Event()
    replaced_at: list[float] = []
    returned_at: list[float] = []

    def slow(info: llama_cpp.KvLazyInfo) -> None:
        if running.is_set():
            return
        running.set()
        release.wait(10)
        time.sleep(0.3)  # still running when the other thread asks to replace it
        returned_at.append(time.monotonic())

    def replace() -> None:
        running.wait(10)
        release.set()  # the running call returns a little later, after this thread has asked
        llm.set_kv_lazy_progress_callback(None)
        replaced_at.append(time.monotonic())

    llm.set_kv_lazy_progress_callback(slow)
    thread = threading.Thread(target=replace)
    thread.start()
    llm.eval(random_tokens(2, 600))
    thread.join(10)
    assert not thread.is_alive()
    assert returned_at and replaced_at and replaced_at[0] >= returned_at[0]


CHILD = textwrap.dedent(
    """
    import ctypes, signal, socket, subprocess, sys, threading, time
    import llama_cpp
    from llama_cpp.llama import _rpc_add_server_devices
    from tests.native.rawctx import DecodeError, RawContext, RawModel
    from tests.native.helpers import random_tokens

    model_file, when = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(llama_cpp.rpc_server_path()), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    endpoint = f"127.0.0.1:{port}"

    class RpcModel(RawModel):
        def __init__(self, path):
            devices = _rpc_add_server_devices(endpoint)
            params = llama_cpp.llama_model_default_params()
            self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            params.n_gpu_layers = 999
            self.ptr = llama_cpp.llama_model_load_from_file(path.encode(), params)
            assert self.ptr
            self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.ptr))

    def kill_server():
        server.send_signal(signal.SIGKILL)
        server.wait()

    model = RpcModel(model_file)
    ctx = RawContext(model, llama_cpp.GGML_TYPE_Q8_0, n_ctx=1024, lazy=True)
    ctx.decode(random_tokens(1, 100), pos0=0)

    if when == "conversion":
        @llama_cpp.llama_kv_lazy_progress_callback
        def on_progress(info_p, _data):
            info = info_p.contents
            converting = info.converting
            if converting and info.progress_done >= 1 and server.poll() is None:
                kill_server()
        llama_cpp.llama_kv_lazy_set_progress_callback(ctx.ptr, on_progress, None)
        tokens = random_tokens(2, 500)  # past the f16 view of 512 cells
    elif when == "mid-decode":
        # the server stops before the batch reaches it and dies while the batch's logits are owed: the
        # decode queues the graph and the copy of its outputs and returns; reading the logits finds the
        # server gone, and the next decode fails
        server.send_signal(signal.SIGSTOP)
        threading.Timer(1.0, kill_server).start()
        tokens = random_tokens(2, 1)
    else:
        kill_server()
        tokens = random_tokens(2, 1)

    for attempt in (1, 2, 3):
        try:
            ctx.decode(tokens if attempt == 1 else random_tokens(2 + attempt, 1))
        except DecodeError as err:
            print("DECODE_FAILED", attempt, err.rc, flush=True)
            break
    else:
        print("DECODE_SUCCEEDED", flush=True)
    del ctx, model
    print("CLEAN_EXIT", flush=True)
    """
)


@pytest.mark.parametrize("when", ["between-decodes", "mid-decode", "conversion"])
def test_dead_rpc_server_fails_the_decode_instead_of_ending_the_process(model_file: Path, when: str) -> None:
    path = [str(ROOT), str(ROOT / "app"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    res = subprocess.run([sys.executable, "-c", CHILD, str(model_file), when], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"ended with {res.returncode}:\n{res.stdout}\n{res.stderr[-3000:]}"
    assert "CLEAN_EXIT" in res.stdout, res.stdout
    failed = re.search(r"DECODE_FAILED (\d) (-?\d+)", res.stdout)
    assert failed is not None, res.stdout
    assert int(failed.group(1)) <= 2 and int(failed.group(2)) < 0, res.stdout  # an error, not "no KV slot"
    assert "stopped answering" in res.stderr
