"""A conversation exported to a file (Markdown or JSON) and a JSON export imported, for
``Conversations`` (its ``files``): the file choosers here, the formats in core
(``lazykv.core.history.exchange``).

Export suggests the user's documents folder (the home folder where there is none) and the chat's
title as the file's name, made safe for every file system."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import (
    QFileDialog,
    QWidget,
)

from lazykv.core.files import write_text_atomic
from lazykv.core.history.records import (
    OpChanges,
    StoreError,
)
from lazykv.core.history.store import Store
from lazykv.core.kinds import ExportFormat
from lazykv.qt.conversations_panel import ConversationsPanel
from lazykv.qt.elided_label import StatusBar

EXPORT_NAME_MAX_CHARS = 80  # a suggested file name (a chat's title) is cut to this, before its suffix
EXPORT_NAME_MAX_BYTES = 200  # and to this in UTF-8: file systems take 255 bytes a name
EXPORT_FALLBACK_NAME = "conversation"  # for a title with nothing usable in a file name
# characters no file name may hold on Windows (and "/" nowhere), read as a space
_FORBIDDEN = re.compile(r'[/\\:*?"<>|]')
# names Windows keeps for devices, whatever the extension ("con.md" opens the console)
_RESERVED = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)),
                       *(f"lpt{i}" for i in range(10))})


def safe_file_name(title: str | None) -> str:
    """``title`` as a file name (without suffix) every file system takes: no slashes, reserved
    characters or control characters, no leading or trailing dots or spaces, no device name, at most
    EXPORT_NAME_MAX_CHARS characters and EXPORT_NAME_MAX_BYTES bytes."""
    text = "".join(" " if _unsafe(c) else c for c in title or "")
    text = " ".join(_FORBIDDEN.sub(" ", text).split())[:EXPORT_NAME_MAX_CHARS]
    while len(text.encode("utf-8")) > EXPORT_NAME_MAX_BYTES:
        text = text[:-1]
    text = text.strip(" .")
    if not text:
        return EXPORT_FALLBACK_NAME
    if text.split(".", 1)[0].strip().lower() in _RESERVED:
        text = f"_{text}"  # the device name is whatever comes before the first dot
    return text


def _unsafe(c: str) -> bool:
    """A control, format (a bidirectional override: a name that reads backwards), surrogate or
    separator character; the joiners that some scripts and emoji need stay."""
    kind = unicodedata.category(c)
    return kind in ("Cc", "Cs", "Zl", "Zp", "Zs") or (kind == "Cf" and c not in "\u200c\u200d")


def export_folder() -> Path:
    """The user's documents folder, or the home folder where it does not exist."""
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


class FilesWindow(Protocol):
    """What export and import use of the window: the list's titles, the status bar."""

    conversations_panel: ConversationsPanel

    def statusBar(self) -> StatusBar: ...  # noqa: N802 - Qt's name


class DatabaseJobs(Protocol):
    """The database calls of ``Conversations``, on its background thread."""

    def call(self, fn: Callable[[Store], Any], on_done: Callable[[Any], None] | None = None,
             what: str = ..., on_error: Callable[[Exception], None] | None = None) -> None: ...
    def execute(self, op: Callable[[Store], Any], on_done: Callable[[Any], None] | None,
                what: str) -> None: ...


class ConversationFiles:
    """Export and import for ``Conversations``: the file choosers (window-modal on ``dialog_parent``),
    the writing and reading as its database jobs (``jobs``)."""

    def __init__(self, dialog_parent: QWidget, window: FilesWindow, jobs: DatabaseJobs) -> None:
        self._dialogs = dialog_parent
        self.window = window
        self.jobs = jobs

    def export(self, conv_id: int, fmt: ExportFormat) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self._dialogs, "Export conversation", str(self.export_suggestion(conv_id, fmt)), fmt.file_filter
        )
        if path:
            self.export_to(conv_id, fmt, Path(path))

    def export_suggestion(self, conv_id: int, fmt: ExportFormat) -> Path:
        """Where Export offers to write: the documents folder, the chat's title as the name."""
        name = safe_file_name(self.window.conversations_panel.title(conv_id))
        return export_folder() / f"{name}{fmt.suffix}"

    def export_to(self, conv_id: int, fmt: ExportFormat, path: Path) -> None:
        def job(store: Store) -> Path:
            if fmt is ExportFormat.MARKDOWN:
                text = store.export_markdown(conv_id)
            else:
                text = json.dumps(store.export_json(conv_id), indent=2, ensure_ascii=False)
            write_text_atomic(path, text + "\n")
            return path

        def done(written: Path) -> None:
            self.window.statusBar().showMessage(f"Exported to {written}", 5000)

        self.jobs.call(job, done, "Exporting")

    def ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self._dialogs, "Import conversation", "", "JSON (*.json)")
        if path:
            self.import_from(Path(path))

    def import_from(self, path: Path) -> None:
        def job(store: Store) -> OpChanges:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as err:
                raise StoreError(f"{path.name} is not a conversation export ({err}). Choose a file saved "
                                 "with Export (JSON).") from err
            try:
                return store.import_json(data)
            except ValueError as err:  # a part of it that is not a conversation: said as such
                raise StoreError(f"{path.name} is not a conversation export LazyKV Chat can read ({err}). "
                                 "Choose a file saved with Export (JSON).") from err

        self.jobs.execute(job, None, f"Importing {path.name}")
