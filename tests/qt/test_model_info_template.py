"""The window and the Model information dialog say which chat format a model is used with and why
(issue 45, defect 3: a file without a chat template was silently spoken to in ChatML)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from lazykv.core.engine.chat_template import ChatTemplateChoice, TemplateSource
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.types import ModelInfo
from lazykv.qt.model_info_dialog import ModelInfoDialog
from tests.qt.conftest import FakeWindow
from tests.qt.fake_engine import FakeSession

GEMMA = ChatTemplateChoice(TemplateSource.BUILTIN, "gemma", "special tokens", ("<end_of_turn>",))
PLAIN = ChatTemplateChoice(TemplateSource.PLAIN, "plain", end_markers=("\nUser:",))
FILE = ChatTemplateChoice(TemplateSource.FILE)


def _template_row(dialog: ModelInfoDialog) -> str:
    labels = dialog.findChildren(QLabel)
    texts = [label.text() for label in labels]
    return texts[texts.index("Chat template:") + 1]


@pytest.mark.parametrize(("choice", "expected"), [
    (GEMMA, "llama.cpp's built-in “gemma” format: the file has none (chosen by the model's special tokens)"),
    (PLAIN, "none known, the file has no chat template. This may be a base model, not made for chat"),
    (FILE, "From the model file"),
])
def test_the_dialog_says_which_template_and_why(
    qtbot: QtBot, fake_model: Path, choice: ChatTemplateChoice, expected: str
) -> None:
    dialog = ModelInfoDialog(read_model_meta(fake_model), template=choice)
    qtbot.addWidget(dialog)
    assert expected in _template_row(dialog)
    assert "ChatML" not in _template_row(dialog)


def test_without_a_loaded_model_the_dialog_says_the_file_has_none(qtbot: QtBot, fake_model: Path) -> None:
    meta = read_model_meta(fake_model)
    none = replace(meta, has_chat_template=False)
    dialog = ModelInfoDialog(none)
    qtbot.addWidget(dialog)
    assert _template_row(dialog) == "None in the model file: a format is chosen when it loads"


class BuiltinFormatSession(FakeSession):
    """The fake engine, loading a model whose file has no chat template (Gemma's format chosen)."""

    def load(self, *args: Any, **kwargs: Any) -> ModelInfo:
        self._info = replace(super().load(*args, **kwargs), chat_template=GEMMA)
        return self._info


@pytest.fixture
def fake() -> FakeSession:
    return BuiltinFormatSession()


def test_the_window_names_the_format_used_when_the_file_has_none(fake_window: FakeWindow) -> None:
    w = fake_window()
    assert w.model_label.text().endswith(" · built-in gemma chat format (the file has none)")
    w.info_action.trigger()
    dialog = w.findChild(ModelInfoDialog)
    assert dialog is not None and dialog.isVisible()
    assert "built-in “gemma” format: the file has none" in _template_row(dialog)
    dialog.reject()
