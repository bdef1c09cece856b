"""The window loads what one LoadSpec says, the one `serve`, `estimate` and `models` build from the same
settings; a conversation records what it was held in (the loaded model's context and KV cache)."""

from __future__ import annotations

import json
from pathlib import Path

from pytestqt.qtbot import QtBot

from lazykv.cli import serve
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import MiB
from lazykv.core.engine.planner import AUTO
from lazykv.core.kinds import ExportFormat, KvMode
from lazykv.core.settings import GPU_LAYERS_AUTO, load_spec
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession
from tests.qt.helpers import chat, settle


def test_the_window_loads_the_spec_serve_would(fake_window: FakeWindow, fake: FakeSession,
                                               fake_model: Path) -> None:
    w = fake_window(kv_mode="ladder", kv_recent=64, n_gpu_layers=GPU_LAYERS_AUTO, gpu_memory_mb=512)
    spec: LoadSpec = fake.spec
    assert spec == load_spec(w.settings, fake_model)
    assert spec.gpu_layers == AUTO and spec.gpu_memory == 512 * MiB and spec.kv_recent == 64
    assert spec.kv_mode is KvMode.LADDER
    args = serve.build_parser(w.settings).parse_args(["--model", str(fake_model)])
    assert serve.served_spec(args, w.settings) == spec  # the same settings: the same load


def test_an_export_records_the_loaded_context_not_the_setting(qtbot: QtBot, fake_window: FakeWindow,
                                                            fake: FakeSession, tmp_path: Path) -> None:
    """With a context memory budget the loaded context is the budget's, not the context-length setting."""
    w = fake_window(kv_mode="f16", n_ctx=4096, context_budget_mb=1)
    loaded = w.model_info
    assert loaded is not None and loaded.n_ctx != 4096
    chat(qtbot, w, "hello")
    out = tmp_path / "chat.json"
    w.conversations.files.export_to(w.conversations.current, ExportFormat.JSON, out)
    settle(qtbot, w)
    recorded = json.loads(out.read_text())["settings"]
    assert (recorded["n_ctx"], recorded["kv_mode"]) == (loaded.n_ctx, "f16")
