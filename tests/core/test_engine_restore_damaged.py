"""The app's restore path with a damaged engine state: a snapshot whose KV payload was cut and
whose checksum was recomputed (an unencrypted snapshot cannot tell) reaches native code. Into a
lazy iSWA cache that already holds a converted conversation this used to abort the process in
llama_kv_cache::state_clear; it must be a KvRestoreError, and the session must go on.

Runs in a child process, so that an abort fails this test instead of killing pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import sys
    from lazykv.core.engine.engine import EngineSession
    from lazykv.core.engine.types import KvRestoreError
    from lazykv.core.engine.load_spec import LoadSpec

    session = EngineSession()
    session.load(LoadSpec(sys.argv[1], n_ctx=1024, kv_mode="lazy", n_threads=2, kv_recent=0))
    text = "The keeper wrote one line in his log every night, and the sea kept its own time. " * 40
    messages = [{"role": "user", "content": text}]
    session.rebuild_kv(messages, lambda done, total: None)
    assert session.kv_status().phase == "q8_0", session.kv_status()
    good = session.capture_kv()
    n_meta = int.from_bytes(good.state[:4], "little") + 4
    native = len(good.state) - n_meta
    for percent in (30, 45, 60, 75, 90, 99):
        cut = good.state[: n_meta + native * percent // 100]
        try:
            session.restore_kv(good.tokens, cut)
        except KvRestoreError:
            print("refused", percent, flush=True)
        else:
            print("restored", percent, flush=True)
        session.restore_kv(good.tokens, good.state)  # the converted conversation again
        assert session.kv_status().n_cells_used == len(good.tokens)
    print("done", flush=True)
    """
)


def test_cut_state_into_a_converted_lazy_iswa_cache_is_refused(gemma3_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "app"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(gemma3_path)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.split("\n")
    assert "done" in lines
    assert sum(line.startswith("refused") for line in lines) == 6, proc.stdout
