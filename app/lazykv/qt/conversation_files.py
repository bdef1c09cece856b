"""A conversation exported to a file (Markdown or JSON) and a JSON export imported, for
``Conversations``: the file choosers here, the formats in core (``lazykv.core.history.exchange``)."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import (
    QFileDialog,
)

from lazykv.core.files import write_text_atomic
from lazykv.core.history.records import (
    OpChanges,
    StoreError,
)
from lazykv.core.history.store import Store
from lazykv.core.kinds import ExportFormat


class ConversationFiles:
    """The export and import part of ``Conversations`` (mixed into it: it uses its dialogs' parent and
    its database calls)."""

    def export(self, conv_id: int, fmt: ExportFormat) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self._dialogs, "Export conversation", f"conversation{fmt.suffix}", fmt.file_filter
        )
        if path:
            self.export_to(conv_id, fmt, Path(path))

    def export_to(self, conv_id: int, fmt: ExportFormat, path: Path) -> None:
        def job(store: Store) -> Path:
            if fmt is ExportFormat.MARKDOWN:
                text = store.export_markdown(conv_id)
            else:
                text = json.dumps(store.export_json(conv_id), indent=2, ensure_ascii=False)
            write_text_atomic(path, text + "\n")
            return path

        def done(written: Path) -> None:
            self.host.statusBar().showMessage(f"Exported to {written}", 5000)

        self.call(job, done, "Exporting")

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

        self.execute(job, None, f"Importing {path.name}")
