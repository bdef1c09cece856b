"""Export offered `conversation.md` in the working directory (issue 45): it offers the documents
folder (the home folder where there is none) and the chat's title, made a safe file name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from lazykv.core.kinds import ExportFormat
from lazykv.qt import conversation_files
from lazykv.qt.conversation_files import safe_file_name
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import chat


class _Chooser:
    """QFileDialog's save chooser: records what it was offered, answers ``answer``."""

    offered: list[str] = []
    answer = ""

    @classmethod
    def getSaveFileName(cls, _parent: object, _caption: str, offered: str, _filter: str) -> tuple[str, str]:  # noqa: N802
        cls.offered.append(offered)
        return cls.answer, ""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of the test's own (no user-dirs file: its documents folder is ~/Documents)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.setattr(conversation_files, "QFileDialog", _Chooser)
    monkeypatch.setattr(_Chooser, "offered", [])
    return tmp_path


@pytest.mark.parametrize("documents", [True, False])
def test_export_offers_the_documents_folder_and_the_chat_s_title(
    qtbot: QtBot, fake_window: FakeWindow, home: Path, monkeypatch: pytest.MonkeyPatch, documents: bool
) -> None:
    if documents:
        (home / "Documents").mkdir()
    w = fake_window()
    chat(qtbot, w, "Plans for 2025/26: a <draft>")
    conv = w.conversations.current
    folder = home / "Documents" if documents else home
    monkeypatch.setattr(_Chooser, "answer", str(folder / "chosen.md"))
    w.conversations.files.export(conv, ExportFormat.MARKDOWN)
    assert _Chooser.offered == [str(folder / "Plans for 2025 26 a draft.md")]
    qtbot.waitUntil(lambda: (folder / "chosen.md").exists())
    assert "Plans for 2025/26" in (folder / "chosen.md").read_text(encoding="utf-8")
    w.conversations.files.export(conv, ExportFormat.JSON)
    assert _Chooser.offered[-1] == str(folder / "Plans for 2025 26 a draft.json")


@pytest.mark.parametrize(("title", "name"), [
    ("a/b\\c", "a b c"),
    ("../../etc/passwd", "etc passwd"),
    ("tab\tnew\nline\x00nul\x7fdel", "tab new line nul del"),
    ("\u202eexe.txt", "exe.txt"),  # a bidirectional override would show the name backwards
    (" .hidden. ", "hidden"),
    ("CON", "_CON"),
    ("nul.tar.gz", "_nul.tar.gz"),
    ("Console log", "Console log"),
    ("", "conversation"),
    (None, "conversation"),
    ("///", "conversation"),
    ("Grüße, 日本語 👨‍👩‍👧", "Grüße, 日本語 👨‍👩‍👧"),
])
def test_a_title_becomes_a_safe_file_name(title: str | None, name: str) -> None:
    assert safe_file_name(title) == name


def test_a_long_title_is_cut_to_a_bounded_file_name() -> None:
    for title in ("word " * 100, "é" * 300, "日本" * 200):
        name = safe_file_name(title)
        assert 0 < len(name) <= conversation_files.EXPORT_NAME_MAX_CHARS
        assert len(name.encode("utf-8")) <= conversation_files.EXPORT_NAME_MAX_BYTES
        assert title.startswith(name) and not name.endswith((" ", "."))
