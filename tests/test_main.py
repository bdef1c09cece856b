"""Start-up argument handling of ``python -m lazykv`` (without entering the event loop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv import __main__ as entry
from lazykv import __version__
from lazykv.core.engine_check import EngineMissingError


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


def test_missing_model_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--model", str(tmp_path / "absent.gguf")]) != 0
    assert "model file not found" in capsys.readouterr().err


def test_missing_default_model_says_to_run_make_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert entry.main([]) != 0
    assert "make models" in capsys.readouterr().err


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
    assert entry.main(["--ctx", "0"]) == 2
    assert "--ctx must be at least 256 tokens" in capsys.readouterr().err
