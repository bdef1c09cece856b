"""Remote backends on a real llama.cpp RPC server (``ggml-rpc-server`` on 127.0.0.1, from the engine wheel).

The engine registers RPC servers process-wide and aborts the process when one it uses stops answering,
so the loads that use a server run in a child process: an abort fails the test instead of the run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lazykv
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.planner import HOST_CPU
from lazykv.core.engine.remote import (
    RPC_CONN_CAPS_SIZE,
    RPC_PROTO_VERSION,
    Unreachable,
    probe,
    unreachable_text,
)
from lazykv.core.engine.types import SamplingSettings
from tests.support.rpc_server import free_port, rpc_server

CHILD_TIMEOUT_S = 300
REFUSED = "nothing is listening on that port (connection refused)"

# argv: model, endpoint, KV mode, and "then-gone" to load a second time. Loads with every layer on the
# server, replies, shows the memory panel; with "then-gone", after a line on stdin (once the parent stopped
# the server) loads again asking for the same server.
CHILD = r"""
import json, sys, threading
from PySide6.QtWidgets import QApplication
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.qt.memory_panel import MemoryPanel

def report(session, info):
    panel = MemoryPanel()
    panel.set_model(info)
    panel.set_status(session.kv_status())
    memory = [dict(place=p.place, host=p.host, weights=p.weights, kv=p.kv) for p in info.memory]
    text = "".join(session.stream_reply([{"role": "user", "content": "Say hi."}], SamplingSettings(
        temperature=0.0, seed=1), threading.Event(), max_tokens=4))
    out = dict(remote=list(info.remote), unreachable=[[u.endpoint, u.reason] for u in info.unreachable],
               memory=memory, kv_label=panel.kv_label.text(), weights_label=panel.weights_label.text(),
               reply=text)
    print("RESULT " + json.dumps(out), flush=True)

app = QApplication([])
model, endpoint, kv_mode, then = sys.argv[1:5]
session = EngineSession()
spec = LoadSpec(model, n_ctx=1024, kv_mode=kv_mode, rpc_servers=[endpoint], kv_recent=0)
report(session, session.load(spec))
if then == "then-gone":
    sys.stdin.readline()
    report(session, session.load(spec))
session.close()
"""


def _run_child(
    model: Path, kv_mode: str, then_gone: bool, log: Path
) -> tuple[list[dict[str, Any]], str, str]:
    """The child's results, its output, and the endpoint of the server it used (stopped before its second
    load when ``then_gone``)."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([str(Path(lazykv.__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    then = "then-gone" if then_gone else "done"
    with rpc_server(log) as endpoint:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(model), endpoint, kv_mode, then],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=env)
        assert child.stdout is not None
        watchdog = threading.Timer(CHILD_TIMEOUT_S, child.kill)  # a hung load fails the test
        watchdog.start()
        first = child.stdout.readline()
        while first and not first.startswith("RESULT "):  # engine log lines before the result
            first = child.stdout.readline()
    try:
        rest, _ = child.communicate("go\n", timeout=CHILD_TIMEOUT_S)
    finally:
        watchdog.cancel()
        child.kill()
    output = f"{first}{rest}\n(exit {child.returncode})\nserver:\n{log.read_text()}"
    return _results(first + rest), output, endpoint


def _results(stdout: str) -> list[dict[str, Any]]:
    lines = stdout.splitlines()
    return [json.loads(line.removeprefix("RESULT ")) for line in lines if line.startswith("RESULT ")]


def _assert_on_the_server(result: dict[str, Any], endpoint: str, output: str) -> None:
    assert result["remote"] == [endpoint] and result["unreachable"] == [], output
    place = f"device memory (RPC0, {endpoint})"
    device = [p for p in result["memory"] if not p["host"]]
    assert [p["place"] for p in device] == [place], output
    assert device[0]["kv"] > 0 and device[0]["weights"] > 0
    assert all(p["kv"] == 0 for p in result["memory"] if p["host"])  # every layer's cells are on the server
    assert f"in {place}" in result["kv_label"] and f"in {place}" in result["weights_label"]
    assert result["reply"]


@pytest.mark.parametrize("kv_mode", ["lazy", "f16"])
def test_every_layer_on_the_server_and_the_panel_names_it(
    smollm2_path: Path, tmp_path: Path, kv_mode: str
) -> None:
    results, output, endpoint = _run_child(smollm2_path, kv_mode, False, tmp_path / "rpc-server.log")
    assert len(results) == 1, output
    _assert_on_the_server(results[0], endpoint, output)


def test_a_server_gone_since_the_last_load_is_left_out_and_the_app_lives(
    smollm2_path: Path, tmp_path: Path
) -> None:
    results, output, endpoint = _run_child(smollm2_path, "lazy", True, tmp_path / "rpc-server.log")
    assert results, output
    _assert_on_the_server(results[0], endpoint, output)
    assert len(results) == 2, output
    gone = results[1]
    assert gone["remote"] == [] and gone["unreachable"] == [[endpoint, REFUSED]]
    assert all(p["host"] for p in gone["memory"]) and gone["reply"]
    assert HOST_CPU in gone["kv_label"]


def test_an_unreachable_server_is_left_out_and_the_model_runs_here(smollm2_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    session = EngineSession()
    try:
        info = session.load(LoadSpec(smollm2_path, n_ctx=512, rpc_servers=[closed], kv_recent=0))
        assert info.remote == () and info.unreachable == (Unreachable(closed, REFUSED),)
        assert closed in unreachable_text(info.unreachable)
        assert info.memory and all(p.host for p in info.memory) and sum(p.kv for p in info.memory) > 0
        reply = "".join(session.stream_reply([{"role": "user", "content": "Hi"}], SamplingSettings(seed=1),
                                             threading.Event(), max_tokens=4))
        assert reply
    finally:
        session.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "rpc-server.log"
    with rpc_server(log) as endpoint:
        yield endpoint, log


def test_a_busy_server_is_refused_and_survives_the_probe(server: tuple[str, Path]) -> None:
    """ggml-rpc-server serves one client at a time: while another client holds it, the handshake waits;
    the probe gives up, and keeps its connection until the server answers (else SIGPIPE ends it)."""
    endpoint, log = server
    assert probe(endpoint) is None
    host, port = endpoint.split(":")
    with socket.create_connection((host, int(port))) as client:  # another client, handshake done
        client.sendall(bytes([14]) + (RPC_CONN_CAPS_SIZE).to_bytes(8, "little") + bytes(RPC_CONN_CAPS_SIZE))
        reply = b""
        while len(reply) < 8 + 4 + RPC_CONN_CAPS_SIZE:  # size, version, padding, capabilities
            reply += client.recv(64)
        assert tuple(reply[8:10]) == RPC_PROTO_VERSION
        busy = probe(endpoint, timeout=0.3)
        assert busy is not None and "did not answer llama.cpp's handshake" in busy
    assert probe(endpoint, timeout=5) is None, log.read_text()
