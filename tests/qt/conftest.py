"""The window on a fake engine (tests/qt/fake_engine.py): no model, no real-time waiting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from lazykv.core.settings import Settings
from lazykv.qt.main_window import MainWindow, Timings
from lazykv.qt.transcript import TranscriptView
from tests.qt.fake_engine import N_CTX, FakeSession
from tests.qt.helpers import FAST, WAIT_MS, settle
from tests.support.synthetic_gguf import write_llama_gguf


@pytest.fixture(scope="session")
def fake_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("fake-model") / "fake.gguf")


@pytest.fixture
def fake() -> FakeSession:
    return FakeSession()


FakeWindow = Callable[..., MainWindow]


@pytest.fixture
def fake_window(qtbot: QtBot, fake: FakeSession, fake_model: Path) -> Iterator[FakeWindow]:
    """``fake_window(**settings)``: a window on ``fake`` with its model loaded."""
    windows: list[MainWindow] = []

    def make(timings: Timings = FAST, **values: object) -> MainWindow:
        settings = Settings()
        defaults = {"idle_conversion": False, "snapshot_encryption": "none", "n_ctx": N_CTX}
        for name, value in {**defaults, **values}.items():
            settings.set(name, value)
        w = MainWindow(settings, session=fake, timings=timings)  # type: ignore[arg-type]
        qtbot.addWidget(w)
        windows.append(w)
        w.show()
        with qtbot.waitSignal(w.model_loaded, timeout=WAIT_MS):
            w.loading.open_model(fake_model)
        settle(qtbot, w)
        return w

    yield make
    fake.release()
    for w in windows:
        w.close()


@pytest.fixture
def view(qtbot: QtBot) -> TranscriptView:
    """A transcript on its own, shown at a fixed size."""
    widget = TranscriptView()
    qtbot.addWidget(widget)
    widget.resize(700, 500)
    widget.show()
    qtbot.waitExposed(widget)
    return widget
