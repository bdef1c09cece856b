"""A crafted GGUF file given to the app (``--model``, File > Open model) shows a sentence; the app lives on.

Before model_meta checked hyper-parameters, ``llama.block_count = 0x7fffffff`` aborted the
whole app (rc 134, no message) in llama.cpp's load_hparams. The ``--model`` case runs the real
entry point in a child process, so that an abort fails this test instead of killing pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytestqt.qtbot import QtBot

import lazykv
from lazykv.qt.main_window import MainWindow, UiState
from tests.qt.helpers import error_box
from tests.qt.test_main_window import LOAD_TIMEOUT_MS, open_window
from tests.support.crafted_gguf import ARRAY, F32, STRING, U32, gguf_bytes, with_kv

ABSURD = {  # file name -> (key, GGUF type, value), words of the message, words of its details
    "layers.gguf": (("llama.block_count", U32, 0x7FFFFFFF), "it declares 2147483647 layers",
                    "plausible: 1..512"),
    "nan.gguf": (("llama.block_count", F32, float("nan")), "not a whole number", "= nan (GGUF type 6)"),
    "blob.gguf": (("llama.attention.head_count", ARRAY, (U32, [2] * 7)), "layers but", "has 7 values"),
    "rope.gguf": (("llama.rope.scaling.type", STRING, "bogus"), "unknown RoPE scaling type", "known: ["),
}
# the child starts the app as `python -m lazykv --model FILE` does, and reports the error box's text
CHILD = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
from lazykv import __main__ as entry

app = QApplication([sys.argv[0]])

def poll():
    boxes = [w for w in app.topLevelWidgets() if isinstance(w, QMessageBox) and w.objectName() == "error-box"]
    if boxes and boxes[0].isVisible():
        print("ERROR-BOX " + boxes[0].text().replace("\\n", " "), flush=True)
        app.quit()

timer = QTimer()
timer.timeout.connect(poll)
timer.start(50)
QTimer.singleShot(50_000, lambda: app.exit(3))
sys.exit(entry.main(["--model", sys.argv[1], "--kv", "f16"]))
"""


def _write(tmp_path: Path, name: str) -> Path:
    (key, vtype, value), _, _ = ABSURD[name]
    path = tmp_path / name
    path.write_bytes(gguf_bytes(with_kv(key, vtype, value)))
    return path


def test_model_option_with_a_crafted_file_shows_the_reason_and_exits_cleanly(tmp_path: Path) -> None:
    path = _write(tmp_path, "layers.gguf")
    app_dir = str(Path(lazykv.__file__).parents[1])
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([app_dir, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                          timeout=90, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    shown = [line for line in proc.stdout.splitlines() if line.startswith("ERROR-BOX ")]
    assert shown, proc.stdout + proc.stderr[-3000:]
    assert "layers.gguf is not a usable model: it declares 2147483647 layers." in shown[0]


def test_open_model_refuses_crafted_files_and_keeps_the_loaded_model(
    qtbot: QtBot, tmp_path: Path, smollm2_path: Path
) -> None:
    window: MainWindow = open_window(qtbot, smollm2_path)
    for name, (_, words, details) in ABSURD.items():
        window.loading.open_model(_write(tmp_path, name))
        qtbot.waitUntil(lambda: error_box(window) is not None, timeout=LOAD_TIMEOUT_MS)
        box = error_box(window)
        assert box is not None and words in box.text() and name in box.text()
        assert details in box.detailedText()  # on demand
        box.accept()
        qtbot.waitUntil(lambda: error_box(window) is None)
        assert window.state is UiState.READY
        assert window.model_info is not None and window.model_info.path == smollm2_path
    window.close()
