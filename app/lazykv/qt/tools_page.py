"""Settings > Tools: the MCP servers (add, remove, import an mcp.json, enable each, see its state and
tools, its stderr on demand) and the tools always allowed (revoke).

Server changes apply at once: the list is saved (``core.tools.mcp_config``) and the hub reconfigured,
which connects on its own thread; the hub's news arrive here through a queued signal. The tool call
timeout and output cap are ordinary settings, placed on this page by the settings dialog.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.tools.consent import ConsentStore
from lazykv.core.tools.mcp_config import (
    McpConfigError,
    McpServerConfig,
    import_mcp_json,
    load_servers,
    save_servers,
)
from lazykv.core.tools.mcp_hub import McpHub, ServerState, ServerStatus

STATE_COLORS = {ServerState.READY: "#1a7f37", ServerState.STARTING: "#b08800",
                ServerState.FAILED: "#cf222e", ServerState.DISABLED: "#6e7781"}
STATE_WORDS = {ServerState.READY: "Ready", ServerState.STARTING: "Starting",
               ServerState.FAILED: "Failed", ServerState.DISABLED: "Disabled"}
COL_NAME, COL_TRANSPORT, COL_STATE = range(3)


class _HubNews(QObject):
    """Carries the hub's on_change (any thread) to the GUI thread."""

    changed = Signal()


class AddServerDialog(QDialog):
    """A new server: a name and a command line (run over stdio) or a streamable-HTTP URL."""

    def __init__(self, parent: QWidget | None, taken: set[str]) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add an MCP server")
        self.setObjectName("tools-add-dialog")
        self._taken = taken
        self.config: McpServerConfig | None = None
        self.name = QLineEdit()
        self.kind = QComboBox()
        self.kind.addItem("Command (stdio)", "stdio")
        self.kind.addItem("URL (streamable HTTP)", "http")
        self.command = QLineEdit()
        self.command.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem /home/me/notes")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://127.0.0.1:8000/mcp")
        self.problem = QLabel()
        self.problem.setObjectName("tools-add-problem")
        self.problem.setTextFormat(Qt.TextFormat.PlainText)
        self.problem.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Name:", self.name)
        form.addRow("Kind:", self.kind)
        form.addRow("Command line:", self.command)
        form.addRow("URL:", self.url)
        ok_cancel = QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        buttons = QDialogButtonBox(ok_cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.problem)
        layout.addWidget(buttons)
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self._kind_changed()

    def _kind_changed(self) -> None:
        stdio = self.kind.currentData() == "stdio"
        self.command.setEnabled(stdio)
        self.url.setEnabled(not stdio)

    def build(self) -> McpServerConfig:
        """The server as entered; McpConfigError (a sentence) when it cannot be one."""
        name = self.name.text().strip()
        if name in self._taken:
            raise McpConfigError(f"There is already a server named \u201c{name}\u201d.")
        if self.kind.currentData() == "http":
            return McpServerConfig(name, url=self.url.text().strip())
        try:
            words = shlex.split(self.command.text())
        except ValueError as e:
            raise McpConfigError(f"The command line could not be read ({e}).") from e
        return McpServerConfig(name, command=words[0] if words else "", args=tuple(words[1:]))

    def accept(self) -> None:
        try:
            self.config = self.build()
        except McpConfigError as e:
            self.problem.setText(str(e))
            return
        super().accept()


class ToolsPage(QWidget):
    """The Tools page of the settings dialog, over the app's ``hub`` and ``consent`` store."""

    def __init__(self, hub: McpHub, consent: ConsentStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("tools-page")
        self.hub = hub
        self.consent = consent
        self._filling = False
        self._dialog: QDialog | None = None
        self.problem = QLabel()
        self.problem.setObjectName("tools-problem")
        self.problem.setTextFormat(Qt.TextFormat.PlainText)
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet(f"color: {STATE_COLORS[ServerState.FAILED]}")
        try:
            self.servers = load_servers()
            self._editable = True
        except McpConfigError as e:
            self.servers = []
            self._editable = False
            self.problem.setText(f"{e} Fix or remove the file; until then the list cannot be changed here.")

        self.tree = QTreeWidget()
        self.tree.setObjectName("tools-servers")
        self.tree.setHeaderLabels(["Server", "Kind", "State"])
        self.tree.setRootIsDecorated(False)
        self.tree.itemChanged.connect(self._item_changed)
        self.tree.currentItemChanged.connect(lambda *_: self._show_selected())

        self.add_button = QPushButton("Add\u2026")
        self.remove_button = QPushButton("Remove")
        self.import_button = QPushButton("Import mcp.json\u2026")
        self.add_button.clicked.connect(self._add)
        self.remove_button.clicked.connect(self._remove)
        self.import_button.clicked.connect(self._import)
        row = QHBoxLayout()
        for button in (self.add_button, self.remove_button, self.import_button):
            button.setEnabled(self._editable)
            row.addWidget(button)
        row.addStretch()

        self.detail = QLabel()
        self.detail.setObjectName("tools-detail")
        self.detail.setTextFormat(Qt.TextFormat.PlainText)
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.tools_list = QListWidget()
        self.tools_list.setObjectName("tools-tools")
        self.stderr_button = QPushButton("Show stderr")
        self.stderr_button.setCheckable(True)
        self.stderr_button.toggled.connect(lambda _: self._show_selected())
        self.stderr_view = QPlainTextEdit()
        self.stderr_view.setObjectName("tools-stderr")
        self.stderr_view.setReadOnly(True)
        self.stderr_view.hide()

        servers_box = QGroupBox("MCP servers")
        servers_layout = QVBoxLayout(servers_box)
        servers_layout.addWidget(self.problem)
        servers_layout.addWidget(self.tree)
        servers_layout.addLayout(row)
        servers_layout.addWidget(self.detail)
        servers_layout.addWidget(self.tools_list)
        servers_layout.addWidget(self.stderr_button, 0, Qt.AlignmentFlag.AlignLeft)
        servers_layout.addWidget(self.stderr_view)

        self.permissions = QListWidget()
        self.permissions.setObjectName("tools-permissions")
        self.revoke_button = QPushButton("Revoke")
        self.revoke_button.clicked.connect(self._revoke)
        permissions_box = QGroupBox("Remembered permissions")
        permissions_layout = QVBoxLayout(permissions_box)
        note = QLabel("Tools you chose to always allow run without asking. Revoke one to be asked again.")
        note.setWordWrap(True)
        permissions_layout.addWidget(note)
        permissions_layout.addWidget(self.permissions)
        permissions_layout.addWidget(self.revoke_button, 0, Qt.AlignmentFlag.AlignLeft)

        layout = QVBoxLayout(self)
        layout.addWidget(servers_box, 3)
        layout.addWidget(permissions_box, 1)

        self._news = _HubNews(self)
        self._news.changed.connect(self._refresh_states)
        news = self._news
        listener: Callable[[], None] = news.changed.emit
        hub.on_change(listener)
        self.destroyed.connect(lambda *_: hub.off_change(listener))
        self._fill()
        self._fill_permissions()

    # --- servers ---

    def _fill(self) -> None:
        current = self._selected_name()
        self._filling = True
        self.tree.clear()
        for config in self.servers:
            item = QTreeWidgetItem([config.name, "URL" if config.url else "Command", ""])
            item.setData(COL_NAME, Qt.ItemDataRole.UserRole, config.name)
            flags = item.flags() | Qt.ItemFlag.ItemIsUserCheckable
            item.setFlags(flags if self._editable else flags & ~Qt.ItemFlag.ItemIsEnabled)
            item.setCheckState(COL_NAME, Qt.CheckState.Checked if config.enabled else Qt.CheckState.Unchecked)
            item.setToolTip(COL_NAME, config.describe())
            self.tree.addTopLevelItem(item)
            if config.name == current:
                self.tree.setCurrentItem(item)
        self._filling = False
        if self.tree.currentItem() is None and self.tree.topLevelItemCount():
            self.tree.setCurrentItem(self.tree.topLevelItem(0))
        self._refresh_states()

    def status_of(self, name: str) -> ServerStatus:
        config = next(c for c in self.servers if c.name == name)
        if not config.enabled:
            return ServerStatus(ServerState.DISABLED, "Disabled.", "")
        return self.hub.status().get(name) or ServerStatus(ServerState.STARTING, "Not started yet.", "")

    def _refresh_states(self) -> None:
        self._filling = True
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            status = self.status_of(item.data(COL_NAME, Qt.ItemDataRole.UserRole))
            item.setText(COL_STATE, STATE_WORDS[status.state])
            item.setForeground(COL_STATE, QColor(STATE_COLORS[status.state]))
            item.setToolTip(COL_STATE, status.message)
        self._filling = False
        self._show_selected()

    def _selected_name(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(COL_NAME, Qt.ItemDataRole.UserRole) if item is not None else None

    def _show_selected(self) -> None:
        name = self._selected_name()
        self.remove_button.setEnabled(self._editable and name is not None)
        self.tools_list.clear()
        if name is None:
            self.detail.setText("No MCP servers yet: add one, or import an mcp.json (Claude Desktop's, "
                                "LM Studio's).")
            self.stderr_button.setEnabled(False)
            self.stderr_view.hide()
            return
        config = next(c for c in self.servers if c.name == name)
        status = self.status_of(name)
        self.detail.setText(f"{config.describe()}\n{status.message}")
        for spec in self.hub.server_tools(name):
            text = f"{spec.name} \u2014 {spec.description}" if spec.description else spec.name
            item = QListWidgetItem(text)
            item.setToolTip(spec.qualified)
            self.tools_list.addItem(item)
        self.stderr_button.setEnabled(bool(status.stderr) or status.state is ServerState.FAILED)
        show = self.stderr_button.isChecked() and self.stderr_button.isEnabled()
        self.stderr_view.setVisible(show)
        if show and self.stderr_view.toPlainText() != (status.stderr or "(nothing on stderr)"):
            self.stderr_view.setPlainText(status.stderr or "(nothing on stderr)")

    def _apply(self, servers: list[McpServerConfig]) -> bool:
        try:
            save_servers(servers)
        except (McpConfigError, OSError) as e:
            self.problem.setText(f"The MCP servers could not be saved: {e}")
            return False
        self.problem.clear()
        self.servers = servers
        self.hub.set_servers(servers)
        self._fill()
        return True

    def _item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if self._filling or column != COL_NAME:
            return
        name = item.data(COL_NAME, Qt.ItemDataRole.UserRole)
        enabled = item.checkState(COL_NAME) == Qt.CheckState.Checked
        servers = [replace(c, enabled=enabled) if c.name == name else c for c in self.servers]
        self._apply(servers)

    def _add(self) -> None:
        dialog = AddServerDialog(self, {c.name for c in self.servers})
        dialog.accepted.connect(lambda: dialog.config and self._apply([*self.servers, dialog.config]))
        self._dialog = dialog
        dialog.open()

    def _remove(self) -> None:
        name = self._selected_name()
        if name is not None:
            self._apply([c for c in self.servers if c.name != name])

    def _import(self) -> None:
        dialog = QFileDialog(self, "Import an mcp.json", "", "MCP configuration (*.json);;All files (*)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.fileSelected.connect(self.import_file)
        self._dialog = dialog
        dialog.open()

    def import_file(self, path: str) -> None:
        """Merge the servers of the mcp.json at ``path`` into the list (by name)."""
        try:
            servers = import_mcp_json(path)
        except McpConfigError as e:
            self.problem.setText(str(e))
            return
        self.problem.clear()
        self.servers = servers
        self.hub.set_servers(servers)
        self._fill()

    # --- permissions ---

    def _fill_permissions(self) -> None:
        self.permissions.clear()
        for server, tool in self.consent.remembered():
            item = QListWidgetItem(f"{tool} (server {server})")
            item.setData(Qt.ItemDataRole.UserRole, (server, tool))
            self.permissions.addItem(item)
        if self.consent.problem:
            self.problem.setText(self.consent.problem)
        self.revoke_button.setEnabled(self.permissions.count() > 0)

    def _revoke(self) -> None:
        item = self.permissions.currentItem() or self.permissions.item(0)
        if item is None:
            return
        server, tool = item.data(Qt.ItemDataRole.UserRole)
        self.consent.revoke(server, tool)
        self._fill_permissions()

