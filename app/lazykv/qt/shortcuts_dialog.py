"""Help > Keyboard shortcuts: every key of the window, from the actions' declaration (lazykv.qt.actions)."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from lazykv.qt.actions import shortcut_rows


class ShortcutsDialog(QDialog):
    """The declared actions' keys as this platform binds them, then the keys widgets handle themselves."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.setObjectName("shortcuts-dialog")
        rows = shortcut_rows()
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(["Action", "Keys", "Where"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for row, cells in enumerate(rows):
            for column, text in enumerate(cells):
                self.table.setItem(row, column, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(560, 480)
