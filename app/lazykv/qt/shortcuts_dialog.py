"""Help > Keyboard shortcuts: every shortcut of the window's actions, read from the actions themselves."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

# keys handled by widgets rather than window actions
WIDGET_KEYS = [
    ("Send the message", "Enter"),
    ("New line in the message", "Shift+Enter"),
    ("Leave editing a message (in the message box)", "Esc"),
    ("Delete the selected conversation", "Del"),
]


def shortcut_rows(actions: Iterable[QAction]) -> list[tuple[str, str]]:
    """(what it does, keys) for every action that has a shortcut, then the widgets' keys."""
    rows = []
    for action in actions:
        keys = ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts())
        if keys:
            rows.append((action.text().replace("&", "").rstrip("…"), keys))
    return rows + WIDGET_KEYS


class ShortcutsDialog(QDialog):
    def __init__(self, actions: Iterable[QAction], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setObjectName("shortcuts-dialog")
        rows = shortcut_rows(actions)
        self.table = QTableWidget(len(rows), 2)
        self.table.setHorizontalHeaderLabels(["Action", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for row, (what, keys) in enumerate(rows):
            self.table.setItem(row, 0, QTableWidgetItem(what))
            self.table.setItem(row, 1, QTableWidgetItem(keys))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(460, 420)
