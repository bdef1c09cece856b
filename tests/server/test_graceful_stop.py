"""A SIGTERM of `python -m lazykv serve` right after a reply keeps that reply's snapshot (a real child
process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lazykv.server.prefix_cache import INDEX, SUFFIX
from lazykv.server.service import free_port
from tests.native.rawctx import engine_threads

PROMPT = "Here is a list: " + ", ".join(f"item {i}" for i in range(300)) + ". Which item comes first?"


def test_a_sigterm_right_after_a_reply_keeps_its_snapshot(smollm2_path: Path, tmp_path: Path) -> None:
    port = free_port()
    cache = tmp_path / "api-cache"
    env = {**os.environ, "LAZYKV_DATA_DIR": str(tmp_path / "data"),
           "LAZYKV_CONFIG_DIR": str(tmp_path / "config")}
    child = subprocess.Popen(
        [sys.executable, "-m", "lazykv", "serve", "--model", str(smollm2_path), "--port", str(port),
         "--no-encryption", "--api-cache-dir", str(cache), "--ctx", "2048", "--kv", "f16",
         "--threads", str(engine_threads()), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert child.poll() is None and time.monotonic() < deadline, child.stdout.read().decode()
                time.sleep(0.2)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": "m", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}]})  # fmt: skip
        assert answer.status_code == 200
        child.send_signal(signal.SIGTERM)  # the snapshot is written after the answer is out
        output = child.communicate(timeout=120)[0].decode()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, output
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    entries = json.loads((folder / INDEX).read_text())["entries"]
    assert len(entries) == 1 and entries[0]["n_tokens"] > 300
    assert (folder / f"{entries[0]['digest']}{SUFFIX}").is_file()
    assert not [p for p in folder.rglob("*") if p.name.startswith(".")]  # nothing half-written
