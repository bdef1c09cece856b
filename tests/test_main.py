"""Start-up argument handling of ``python -m lazykv`` (without entering the event loop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lazykv
from lazykv import __main__ as entry
from lazykv import __version__
from lazykv.core.engine.engine_check import EngineMissingError


@pytest.fixture(autouse=True)
def _no_dialogs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up errors go to stderr only: a modal box would wait for a click."""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        entry.main(["--version"])
    assert exited.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        entry.main(["--help"])
    out = capsys.readouterr().out
    for option in ("--model", "--ctx", "--kv", "--version"):
        assert option in out


# the child runs ``python -m lazykv`` with ``argv``; it reports the error box, accepts it, then in the
# file chooser that follows picks ``pick`` (or cancels when it is empty) and reports what the window shows
CHILD = """
import json, sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox
from lazykv import __main__ as entry
from lazykv.qt.main_window import MainWindow

app = QApplication([sys.argv[0]])
argv, pick = json.loads(sys.argv[1]), sys.argv[2]

def poll():
    for w in app.topLevelWidgets():
        if not w.isVisible():
            continue
        if isinstance(w, QMessageBox) and w.objectName() == "error-box":
            print("ERROR-BOX " + w.text().replace("\\n", " "), flush=True)
            w.accept()
        elif isinstance(w, QFileDialog):
            print("FILE-DIALOG", flush=True)
            if pick:  # typed, as a user would
                w.findChild(QLineEdit, "fileNameEdit").setText(pick)
                w.accept()
            else:
                w.reject()
                QTimer.singleShot(300, lambda: report(window()))
        elif isinstance(w, MainWindow) and w.model_info is not None:
            report(w)

def window():
    return next(w for w in app.topLevelWidgets() if isinstance(w, MainWindow))

def report(w):
    print(f"WINDOW {w.isVisible()} model={w.model_info.name if w.model_info else None}", flush=True)
    w.close()

timer = QTimer()
timer.timeout.connect(poll)
timer.start(50)
QTimer.singleShot(60_000, lambda: app.exit(3))
sys.exit(entry.main(argv))
"""


def _run_app(tmp_path: Path, argv: list[str], pick: str = "", **env: str) -> tuple[list[str], str]:
    """Run the app in a child process (offscreen, its own settings and data); its reports and stderr."""
    app_dir = str(Path(lazykv.__file__).parents[1])
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", LAZYKV_CONFIG_DIR=str(tmp_path / "config"),
               LAZYKV_DATA_DIR=str(tmp_path / "data"),
               PYTHONPATH=os.pathsep.join([app_dir, os.environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv), pick], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout.splitlines(), proc.stderr


def test_a_missing_model_is_shown_then_another_one_is_chosen(tmp_path: Path, smollm2_path: Path) -> None:
    """``--model /nope.gguf``: the error, then the file chooser; the app stays and loads the one chosen."""
    reports, err = _run_app(tmp_path, ["--model", str(tmp_path / "nope.gguf"), "--ctx", "512"],
                            pick=str(smollm2_path))
    assert "model file not found" in err
    assert reports[0].startswith("ERROR-BOX ") and "nope.gguf" in reports[0], reports
    assert "Choose another model" in reports[0]
    assert reports[1:] == ["FILE-DIALOG", "WINDOW True model=SmolLM2-135M-Instruct.Q4_1"], reports


def test_without_the_default_model_the_window_says_to_run_make_models_and_stays(tmp_path: Path) -> None:
    reports, err = _run_app(tmp_path, [], XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert "make models" in err and "make models" in reports[0], reports
    assert reports[1:] == ["FILE-DIALOG", "WINDOW True model=None"], reports  # chooser cancelled


def test_default_model_is_smollm2(smollm2_path: Path) -> None:
    assert entry.default_model_path() == smollm2_path


def test_missing_engine_is_reported_with_what_to_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_engine() -> None:
        raise EngineMissingError("llama_cpp 0.3.36 is installed, but ...; run `make engine`")

    monkeypatch.setattr(entry, "check_engine", no_engine)
    assert entry.main([]) == 1
    assert "run `make engine`" in capsys.readouterr().err


def test_ctx_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        entry.main(["--ctx", "0"])
    assert exit_.value.code == 2
    assert "argument --ctx: 0 is below the minimum 256" in capsys.readouterr().err
