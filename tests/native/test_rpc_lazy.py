"""The lazy cache in device memory: every layer and the KV cache on llama.cpp's RPC backend.

A `ggml-rpc-server` on 127.0.0.1 serves its CPU backend; to this process its buffers are not host
memory, so the cache takes the device path (patch 0011): the conversion runs as ggml ops on the
server, after the last graph is done, and no cache byte travels through this process. The
server's socket traffic (/proc/PID/io) proves the latter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import Llama

from .helpers import make_llama
from .rawctx import engine_threads
from .state_blob import byte_mismatches, conversion_mismatches, parse_context_state
from .test_lazy_cache import assert_kld_no_worse_than_q8_0, corpus, kld

N_CTX = 512
N_F16 = 256  # floor(512 * 34/64) = 272, rounded down to the 256-cell padding


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """A ggml-rpc-server child process on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            # as many threads as the tests' own contexts (1 in an xdist worker): the CPU backend's sums
            # depend on its thread count, so a device/host comparison holds only with the same count
            [str(llama_cpp.rpc_server_path()), "-H", "127.0.0.1", "-p", str(self.port),
             "-t", str(engine_threads())],
            # its log into a file, never an unread pipe: a full pipe would stop the server mid-test
            stdout=self.log, stderr=self.log,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.log.seek(0)
                    err = self.log.read().decode(errors="replace")
                    raise RuntimeError(f"ggml-rpc-server did not start: {err}") from None
                time.sleep(0.1)

    def accepted(self) -> int:
        """Connections the server has accepted so far (a line of its log each)."""
        fd = self.log.fileno()  # read without moving the offset the server writes at (one file description)
        return os.pread(fd, os.fstat(fd).st_size, 0).count(b"Accepted client connection")

    def io_bytes(self) -> int:
        """Bytes the server has read and written through system calls (its socket traffic)."""
        fields = dict(line.split(": ") for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines())
        return int(fields["rchar"]) + int(fields["wchar"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def rpc() -> Iterator[RpcServer]:
    server = RpcServer()
    try:
        assert llama_cpp.rpc_add_server(server.endpoint)
        yield server
    finally:
        server.stop()


def on_rpc(rpc: RpcServer, path: Path, kv: str, **kwargs) -> Llama:
    """Every layer, the output and the KV cache on the RPC device."""
    return make_llama(path, kv, n_ctx=N_CTX, rpc_servers=[rpc.endpoint], n_gpu_layers=-1, **kwargs)


def fill(llm: Llama, tokens: list[int], step: int = 64) -> None:
    for i in range(0, len(tokens), step):
        llm.eval(tokens[i : i + step])


# ---------------------------------------------------------------- where the memory is


def test_rpc_address_checks() -> None:
    with pytest.raises(ValueError, match="host:port"):
        llama_cpp.rpc_add_server("no-port-here")
    with pytest.raises(ConnectionError, match="cannot be reached"):
        llama_cpp.rpc_add_server(f"127.0.0.1:{free_port()}", timeout=1.0)


def test_a_server_in_use_is_not_probed_again(rpc: RpcServer, smollm2_path: Path) -> None:
    """ggml-rpc-server serves one connection at a time with a backlog of one, and a model keeps its
    connection: a probe made meanwhile waits in the server's queue, and the third timed out ("cannot be
    reached") although the server was well. A server this process's models hold is not probed again."""
    first = on_rpc(rpc, smollm2_path, "lazy")
    first.eval(first.tokenize(b"The server holds this model's connection."))
    for _ in range(4):
        assert llama_cpp.rpc_add_server(rpc.endpoint, timeout=1.0)
    second = on_rpc(rpc, smollm2_path, "f16")  # another model beside it, on the same connection
    second.eval(second.tokenize(b"And this one."))
    first.close()
    second.close()
    # no model holds it any more: probed again, each probe a connection the server accepts. Probes in a row
    # may find its queue full while it is not yet scheduled; a dropped connect is retried by the kernel after
    # one second, which the default timeout (3 s) waits for
    before = rpc.accepted()
    for _ in range(2):
        assert llama_cpp.rpc_add_server(rpc.endpoint)
    deadline = time.monotonic() + 10
    while rpc.accepted() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rpc.accepted() >= before + 2


def test_a_model_freed_between_anothers_decodes_leaves_them_exact(rpc: RpcServer, smollm2_path: Path) -> None:
    """A decode that reuses its graph sends the server only the graph's uid; the server keeps the last graph
    of each device per connection and discards it when any buffer is freed. A model freed between another's
    decodes on the same server made the next one ask for a graph the server no longer had: the server closed
    the connection and the decode's logits came back as zeros (a CI flake, where the garbage collector freed
    an earlier test's model at such a moment). The decodes go on as if nothing had been freed."""

    def last_logits(free_between: bool) -> np.ndarray:
        other = on_rpc(rpc, smollm2_path, "f16")
        other.eval(other.tokenize(b"A model beside it, on the same server."))
        llm = on_rpc(rpc, smollm2_path, "f16", logits_all=True)  # (scores holds the logits of every token)
        tokens = corpus(llm, 24)
        llm.eval(tokens[:16])
        for i, token in enumerate(tokens[16:]):
            if free_between and i == 4:
                other.close()  # its buffers freed: the server discards the graphs it keeps
            llm.eval([token])  # single tokens: from the second on, the decode reuses its graph
        logits = np.array(llm.scores[llm.n_tokens - 1])
        llm.close()
        other.close()
        return logits

    freed = last_logits(free_between=True)
    assert np.any(freed != 0)
    np.testing.assert_array_equal(freed, last_logits(free_between=False))


def test_kv_cache_and_weights_live_on_the_rpc_device(rpc: RpcServer, smollm2_path: Path) -> None:
    llm = on_rpc(rpc, smollm2_path, "lazy")
    uses = llm.memory_breakdown()
    device = [u for u in uses if not u.host]
    assert device and all(u.device.startswith("RPC") and rpc.endpoint in u.description for u in device)
    assert sum(u.kv for u in device) == llm.kv_lazy_info().kv_bytes
    assert sum(u.weights for u in device) > 50_000_000
    assert sum(u.kv for u in uses if u.host) == 0


# ---------------------------------------------------------------- f16 phase and the conversion


def test_f16_phase_is_bit_identical_on_the_device(rpc: RpcServer, smollm2_path: Path) -> None:
    lazy = on_rpc(rpc, smollm2_path, "lazy", logits_all=True)
    f16 = on_rpc(rpc, smollm2_path, "f16", logits_all=True)
    tokens = corpus(f16, N_F16)
    for llm in (lazy, f16):
        fill(llm, tokens[:-8])
        for t in tokens[-8:]:
            llm.eval([t])
    assert lazy.kv_lazy_info().phase == "f16"
    np.testing.assert_array_equal(lazy.scores[:N_F16], f16.scores[:N_F16])


def test_device_conversion_matches_the_oracle_and_never_moves_the_cache(
    rpc: RpcServer, smollm2_path: Path
) -> None:
    llm = on_rpc(rpc, smollm2_path, "lazy")
    llm.eval(corpus(llm, 200))
    _, (before,) = parse_context_state(llm.save_state().llama_state)

    io_before = rpc.io_bytes()
    assert llm.kv_lazy_convert()
    moved = rpc.io_bytes() - io_before
    info = llm.kv_lazy_info()
    # the f16 view alone is ~half the cache; the conversion sends graphs and the rotation matrix only
    assert moved < info.kv_bytes / 20, f"{moved} bytes crossed the socket for a {info.kv_bytes}-byte cache"
    assert info.phase == "q8_0" and info.progress_done == info.progress_total > 0

    _, (after,) = parse_context_state(llm.save_state().llama_state)
    assert (after.n_rot_k, after.n_rot_v) == (info.n_rot_k, info.n_rot_v)
    assert after.positions == before.positions
    off, total = conversion_mismatches(before, after)
    assert off / total < 1e-3, f"{off} of {total} codes differ by one"


def test_kld_after_the_breakpoint_on_the_device(rpc: RpcServer, smollm2_path: Path) -> None:
    runs = {kv: on_rpc(rpc, smollm2_path, kv, logits_all=True) for kv in ("f16", "q8_0", "lazy")}
    tokens = corpus(runs["f16"], N_CTX - 24)
    for llm in runs.values():
        fill(llm, tokens, step=128)
    assert_kld_no_worse_than_q8_0(runs, len(tokens), N_F16)


def raw_decode(llm: Llama, tokens: list[int], n_past: int) -> None:
    """One llama_decode without reading its logits (nothing waits for the graph to finish)."""
    llm._batch.set_batch(tokens, n_past=n_past, logits_all=False)
    llm._ctx.decode(llm._batch)


def test_conversion_inside_a_decode_after_unread_decodes(rpc: RpcServer, smollm2_path: Path) -> None:
    """The decode that converts is queued right behind graphs nobody waited for: the conversion
    must see what they wrote (it synchronizes first), so the result equals a run that read every
    decode's logits."""
    results = []
    for read_each in (False, True):
        llm = on_rpc(rpc, smollm2_path, "lazy")
        tokens = corpus(llm, N_F16 + 32)
        for i in range(0, N_F16, 32):
            if read_each:
                llm.eval(tokens[i : i + 32])
            else:
                raw_decode(llm, tokens[i : i + 32], n_past=i)
                llm.n_tokens = i + 32
        assert llm.kv_lazy_info().phase == "f16"
        llm.eval(tokens[N_F16:])  # crosses the breakpoint inside this decode
        assert llm.kv_lazy_info().phase == "q8_0"
        results.append(np.array(llm.scores[llm.n_tokens - 1]))
    np.testing.assert_array_equal(results[0], results[1])


# ---------------------------------------------------------------- seq ops and restores


def test_seq_ops_on_the_device(rpc: RpcServer, smollm2_path: Path) -> None:
    llm = on_rpc(rpc, smollm2_path, "lazy", logits_all=True)
    tokens = corpus(llm, N_F16 + 96)
    fill(llm, tokens)
    assert llm.kv_lazy_info().phase == "q8_0"
    tail = np.array(llm.scores[N_F16 + 64 : N_F16 + 96])
    # drop the last batch's cells and read it again, as the same batch: the same logits
    llm._ctx.kv_cache_seq_rm(0, N_F16 + 64, -1)
    llm.n_tokens = N_F16 + 64
    llm.eval(tokens[N_F16 + 64 :])
    np.testing.assert_array_equal(np.array(llm.scores[N_F16 + 64 : N_F16 + 96]), tail)
    # an emptied cache goes back to f16 at the next batch
    llm._ctx.kv_cache_seq_rm(0, -1, -1)
    llm.n_tokens = 0
    llm.eval(tokens[:8])
    assert llm.kv_lazy_info().phase == "f16"


def test_restore_subset_across_device_and_host(rpc: RpcServer, smollm2_path: Path) -> None:
    """States saved on the device restore on the host and back, in both phases."""
    src = on_rpc(rpc, smollm2_path, "lazy")
    tokens = corpus(src, N_F16 + 64)
    follow = tokens[-8:]

    def next_logits(llm: Llama, state: llama_cpp.LlamaState) -> np.ndarray:
        llm.load_state(state)
        llm.eval(follow)
        return np.array(llm.scores[llm.n_tokens - 1])

    src.eval(tokens[:200])
    f16_state = src.save_state()  # f16 phase
    src.reset()
    src._ctx.kv_cache_clear()
    fill(src, tokens[:-8])
    q8_state = src.save_state()  # q8_0 phase, converted on the device
    assert src.kv_lazy_info().phase == "q8_0"

    # f16-phase state: device -> host lazy and back; both continue exactly as on the device
    ref_f16 = next_logits(on_rpc(rpc, smollm2_path, "lazy"), f16_state)
    host_f16 = next_logits(make_llama(smollm2_path, "lazy", n_ctx=N_CTX), f16_state)
    np.testing.assert_array_equal(host_f16, ref_f16)
    # q8_0-phase state: the host lazy cache converts itself first, then reads the device's q8_0 rows
    ref_q8 = next_logits(on_rpc(rpc, smollm2_path, "lazy"), q8_state)
    host = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    got = next_logits(host, q8_state)
    assert host.kv_lazy_info().phase == "q8_0"
    np.testing.assert_allclose(got, ref_q8, atol=1e-3)
    # and a plain f16 cache refuses q8_0 rows with the reason
    with pytest.raises(llama_cpp.StateMismatchError):
        make_llama(smollm2_path, "f16", n_ctx=N_CTX).load_state(q8_state)


# ---------------------------------------------------------------- compute buffers


@pytest.mark.parametrize("where", ["host", "rpc"])
def test_compute_buffers_do_not_change_across_the_conversion(
    where: str, rpc: RpcServer, smollm2_path: Path
) -> None:
    """Reserved during the f16 phase (a re-reservation: embeddings on and off), the compute buffers
    already fit the q8_0 layout: converting and decoding on does not grow them."""
    if where == "rpc":
        llm = on_rpc(rpc, smollm2_path, "lazy")
    else:
        llm = make_llama(smollm2_path, "lazy", n_ctx=N_CTX)
    tokens = corpus(llm, N_F16 + 64)
    llm.eval(tokens[:64])
    for on in (True, False):  # each change asks the context to reserve again, at the next decode
        llama_cpp.llama_set_embeddings(llm._ctx.ctx, on)
        llm.eval(tokens[llm.n_tokens : llm.n_tokens + 16])
    assert llm.kv_lazy_info().phase == "f16"
    compute = {u.device: u.compute for u in llm.memory_breakdown()}
    fill_to = N_F16 + 64
    while llm.n_tokens < fill_to:
        llm.eval(tokens[llm.n_tokens : llm.n_tokens + 64])
    assert llm.kv_lazy_info().phase == "q8_0"
    assert {u.device: u.compute for u in llm.memory_breakdown()} == compute


def test_memory_breakdown_on_the_host(smollm2_path: Path) -> None:
    llm = make_llama(smollm2_path, "q8_0", n_ctx=N_CTX)
    uses = llm.memory_breakdown()
    assert uses and all(u.host for u in uses)
    assert sum(u.kv for u in uses) == llm.kv_lazy_info().kv_bytes
    assert any(u.device == "CPU" and u.weights > 0 for u in uses)


def test_rpc_server_ships_with_the_engine() -> None:
    path = llama_cpp.rpc_server_path()
    assert path.is_file() and os.access(path, os.X_OK)


# ---------------------------------------------------------------- the ladder on the device


def test_ladder_steps_on_the_device(rpc: RpcServer, smollm2_path: Path) -> None:
    """Both steps of the ladder (f16 -> q8_0 rotated, q8_0 -> q4_0 requantized) run on the server: no
    cache byte crosses the socket, the compute buffers reserved on the f16 rung already fit the last,
    and the cells end as those of the same ladder converted in host memory (q4_0 codes off by at most
    one, rarely)."""
    n_ctx = 1024  # rungs 256 / 512 / 1024
    device = make_llama(smollm2_path, "ladder", n_ctx=n_ctx, rpc_servers=[rpc.endpoint], n_gpu_layers=-1)
    host = make_llama(smollm2_path, "ladder", n_ctx=n_ctx)
    tokens = corpus(host, 200)
    for llm in (device, host):
        llm.eval(tokens)
    compute = {u.device: u.compute for u in device.memory_breakdown()}

    io_before = rpc.io_bytes()
    for rung in ("q8_0", "q4_0"):
        assert device.kv_lazy_convert()
        assert host.kv_lazy_convert()
        info = device.kv_lazy_info()
        assert (info.phase, info.target) == (rung, rung)
        assert info.progress_done == info.progress_total > 0
    moved = rpc.io_bytes() - io_before
    assert moved < info.kv_bytes / 10, f"{moved} bytes crossed the socket for a {info.kv_bytes}-byte cache"
    assert {u.device: u.compute for u in device.memory_breakdown()} == compute

    _, (on_device,) = parse_context_state(device.save_state().llama_state)
    _, (on_host,) = parse_context_state(host.save_state().llama_state)
    assert on_device.positions == on_host.positions
    off, total = byte_mismatches(on_device, on_host, llama_cpp.GGML_TYPE_Q4_0)
    assert off / total < 1e-3, f"{off} of {total} bytes differ"

    # and decoding goes on up to the whole cache, on the device, without another conversion
    fill(device, corpus(device, n_ctx - 24)[200:])
    assert device.kv_lazy_info().n_conversions == 2


@pytest.mark.parametrize("sinks", [0, 4])
def test_recent_window_on_the_device(rpc: RpcServer, smollm2_path: Path, sinks: int) -> None:
    """The recent window (patches 0019, 0024) lives with the cache on the device and is attended there: the
    f16 rung is bit-identical to the cache without a window, and on the q4_0 rung decoding on the device
    agrees with the same ladder in host memory (the server runs as many threads as the host)
    and is closer to f16 than the ladder without the window. With attention sinks (0030) too: the step
    copies their rows into the device's window through the backend, and the device agrees with the host."""
    n_ctx = 1024  # rungs 256 / 512 / 1024

    def ladder(recent: int, device: bool, sinks: int = 0) -> Llama:
        where = {"rpc_servers": [rpc.endpoint], "n_gpu_layers": -1} if device else {}
        return make_llama(smollm2_path, "ladder", n_ctx=n_ctx, kv_lazy_recent=recent, kv_lazy_sinks=sinks,
                          logits_all=True, **where)

    device, host, plain = ladder(64, True, sinks), ladder(64, False, sinks), ladder(0, True)
    uses = device.memory_breakdown()
    assert (sum(u.kv for u in uses if not u.host) == device.kv_lazy_info().kv_bytes
            > plain.kv_lazy_info().kv_bytes)
    assert sum(u.kv for u in uses if u.host) == 0
    tokens = corpus(host, 700)
    for llm in (device, host, plain):
        fill(llm, tokens[:200])
    np.testing.assert_array_equal(device.scores[:200], plain.scores[:200])  # f16 rung: no window in use
    f16 = make_llama(smollm2_path, "f16", n_ctx=n_ctx, logits_all=True)
    fill(f16, tokens[:600])
    for llm in (device, host, plain):
        fill(llm, tokens[200:600])
        assert llm.kv_lazy_info().phase == "q4_0"
    for llm in (device, host, plain, f16):
        for t in tokens[600:640]:
            llm.eval([t])
    rows = slice(600, 640)
    assert kld(host.scores[rows], device.scores[rows]).max() < 1e-4
    assert (kld(f16.scores[rows], device.scores[rows]).mean()
            < 0.9 * kld(f16.scores[rows], plain.scores[rows]).mean())
    if sinks:  # the sinks were copied: the same batches on the device without them read otherwise
        no_sinks = ladder(64, True)
        fill(no_sinks, tokens[:200])
        fill(no_sinks, tokens[200:600])
        for t in tokens[600:640]:
            no_sinks.eval([t])
        assert not np.array_equal(no_sinks.scores[rows], device.scores[rows])
