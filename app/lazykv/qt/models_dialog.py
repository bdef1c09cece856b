"""The Models page: the models already on disk, the Hugging Face Hub's GGUF repos, downloads with
progress and Cancel, and what fits this machine in each KV mode. Choosing a model emits ``model_chosen``;
the window loads it through its own model-loading path.

Everything slow runs off the GUI thread: the disk scan and the Hub's answers on a background thread, the
download in its own process (polled here by a timer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.engine import memory
from lazykv.core.engine.memory import fmt_bytes
from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta
from lazykv.core.engine.planner import Device
from lazykv.core.kinds import KvMode
from lazykv.core.models import download as downloads
from lazykv.core.models.fit import ORDER, FitReport, fit_report, local_devices
from lazykv.core.models.hub import Hub, HubError, HubModel, HubRepo, read_header, repo_models, search
from lazykv.core.models.record import ModelRecord, human_params
from lazykv.core.models.scan import Places, ScanResult, scan
from lazykv.core.models.starter import starter_list
from lazykv.core.settings import Settings, load_spec
from lazykv.qt.background import Background

POLL_MS = 100
KEY = Qt.ItemDataRole.UserRole  # an item's payload
SORT = Qt.ItemDataRole.UserRole + 1  # an item's sort key
LONGEST = tuple(f"Longest {mode}" if mode is KvMode.F16 else str(mode) for mode in KvMode)
DISK_COLUMNS = ("Model", "Arch.", "Quant", "Params", "Size", "Trained ctx", "Template", "Fit", *LONGEST,
                "Found in")
HUB_COLUMNS = ("File", "Quant", "Size", "Fit", *LONGEST)
DISK_FIT, DISK_FOUND = DISK_COLUMNS.index("Fit"), DISK_COLUMNS.index("Found in")
HUB_FIT = HUB_COLUMNS.index("Fit")
FIT_TIP = ("Fit: at the context and KV cache chosen above, against the memory available now. Longest: the "
           "longest context that still fits, in each KV cache mode (tokens); its tooltip, the mode's tokens "
           "per GiB and quality.")


class _Item(QTableWidgetItem):
    """A cell that sorts by its SORT key (numbers, fit order) rather than by its text."""

    def __init__(self, text: str, key: Any = None, payload: Any = None) -> None:
        super().__init__(text)
        self.setFlags(self.flags() & ~Qt.ItemFlag.ItemIsEditable)
        self.setData(SORT, text.lower() if key is None else key)
        if payload is not None:
            self.setData(KEY, payload)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(SORT), other.data(SORT)
        try:
            return bool(mine < theirs)
        except TypeError:
            return str(mine) < str(theirs)


def _hub_key(model: HubModel) -> str:
    return f"{model.repo_id}/{model.name}"


def _fit_cells(report: FitReport | None, problem: str = "") -> list[_Item]:
    """The Fit cell and one Longest cell per KV mode (sorting by fit: fits, tight, does not fit, the rest)."""
    if report is None:
        return [_Item(problem, 9)] + [_Item("", -1) for _ in KvMode]
    cells = [_Item(report.word, ORDER[report.fit])]
    for mode, n in report.max_ctx.items():
        cells.append(_Item(f"{n:,}" if n else "–", n))
        cells[-1].setToolTip(report.context.figures(mode))  # the same words as Settings and estimate
    return cells


class ModelsDialog(QDialog):
    """File > Models…: find a model on disk or on the Hub, see what fits, download, load."""

    model_chosen = Signal(Path)
    planned = Signal()  # the fit columns show the plan for the context and KV mode chosen now

    def __init__(self, settings: Settings, parent: QWidget | None = None, places: Places | None = None,
                 hub: Hub | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("models-dialog")
        self.setWindowTitle("Models")
        self.resize(1040, 620)
        self._settings = settings
        self._places = places
        self._hub = hub
        self._background = Background(self)
        self._records: list[ModelRecord] = []
        self._hub_models: list[HubModel] = []
        self._hub_metas: dict[str, ModelMeta] = {}  # by "repo/file"
        self._header_errors: dict[str, str] = {}  # by "repo/file": why its header could not be read
        self._generation = 0  # answers for an earlier repo are dropped
        self._devices: list[Device] = []  # this machine's GPUs, once the engine has said
        self._fitter = Background(self)  # plans apart from the Hub's answers, so a slow Hub never delays them
        self._fit_generation = 0
        self._reports: dict[tuple[str, str], FitReport] = {}  # ("disk", path) / ("hub", "repo/file")
        self.download: downloads.Download | None = None
        self.downloaded: Path | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._poll_download)
        self._build()
        self._background.run(local_devices, self._devices_found, lambda _err: None, "Finding the GPUs")
        self.rescan()
        self.show_starters()

    # --- building --------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.ctx_box = QSpinBox()
        self.ctx_box.setRange(CTX_PADDING, memory.MAX_CTX)
        self.ctx_box.setSingleStep(CTX_PADDING)
        self.ctx_box.setValue(int(self._settings["n_ctx"]))
        self.ctx_box.setSuffix(" tokens")
        self.kv_box = QComboBox()
        for mode in KvMode:
            self.kv_box.addItem(str(mode), str(mode))
        self.kv_box.setCurrentIndex(self.kv_box.findData(str(self._settings["kv_mode"])))
        self.ctx_box.valueChanged.connect(self._refit)
        self.kv_box.currentIndexChanged.connect(self._refit)
        fit_row = QHBoxLayout()
        fit_row.addWidget(QLabel("What fits this machine at"))
        fit_row.addWidget(self.ctx_box)
        fit_row.addWidget(QLabel("with the KV cache"))
        fit_row.addWidget(self.kv_box)
        fit_row.addStretch(1)
        self.machine_label = QLabel()
        fit_row.addWidget(self.machine_label)
        self._show_machine()
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_disk_tab(), "On this computer")
        self.tabs.addTab(self._build_hub_tab(), "Hugging Face Hub")
        self.tabs.currentChanged.connect(lambda _i: self._update_load())
        self.status = QLabel()
        self.status.setObjectName("models-status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox()
        self.load_button = buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.load_button.setEnabled(False)
        self.load_button.clicked.connect(self._load)
        buttons.addButton(QDialogButtonBox.StandardButton.Close).clicked.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addLayout(fit_row)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.status)
        layout.addWidget(buttons)

    def _table(self, columns: tuple[str, ...]) -> QTableWidget:
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(list(columns))
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.verticalHeader().setVisible(False)
        table.setWordWrap(False)
        for column, name in enumerate(columns):
            if name == "Fit" or name in LONGEST:
                table.horizontalHeaderItem(column).setToolTip(FIT_TIP)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        table.horizontalHeader().setStretchLastSection(True)
        table.setSortingEnabled(True)
        return table

    def _build_disk_tab(self) -> QWidget:
        self.disk_table = self._table(DISK_COLUMNS)
        self.disk_table.itemSelectionChanged.connect(self._update_load)
        self.disk_table.itemDoubleClicked.connect(lambda _item: self._load())
        self.rescan_button = QPushButton("Scan again")
        self.rescan_button.clicked.connect(self.rescan)
        add = QPushButton("Add a folder…")
        add.clicked.connect(self._add_folder)
        self.disk_note = QLabel()
        self.disk_note.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.disk_note, 1)
        row.addWidget(add)
        row.addWidget(self.rescan_button)
        page = QWidget()
        layout = QVBoxLayout(page)
        layout.addWidget(self.disk_table, 1)
        layout.addLayout(row)
        return page

    def _build_hub_tab(self) -> QWidget:
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search GGUF models on the Hub (e.g. qwen, gemma, llama)")
        self.search_edit.returnPressed.connect(self.search)
        search_button = QPushButton("Search")
        search_button.clicked.connect(self.search)
        self.repo_list = QListWidget()
        self.repo_list.currentItemChanged.connect(lambda item, _prev: self._repo_chosen(item))
        self.repo_note = QLabel()
        self.repo_note.setWordWrap(True)
        self.hub_table = self._table(HUB_COLUMNS)
        self.hub_table.itemSelectionChanged.connect(self._update_download)
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress_label = QLabel()
        top = QHBoxLayout()
        top.addWidget(self.search_edit, 1)
        top.addWidget(search_button)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.repo_note)
        right_layout.addWidget(self.hub_table, 1)
        splitter = QSplitter()
        splitter.addWidget(self.repo_list)
        splitter.addWidget(right)
        splitter.setSizes([300, 740])
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.download_button)
        progress_row.addWidget(self.progress, 1)
        progress_row.addWidget(self.progress_label)
        progress_row.addWidget(self.cancel_button)
        page = QWidget()
        layout = QVBoxLayout(page)
        layout.addLayout(top)
        layout.addWidget(splitter, 1)
        layout.addLayout(progress_row)
        return page

    # --- what fits --------------------------------------------------------------------------------------

    def _refit(self) -> None:
        """Plan every model listed for the context and KV mode chosen, off the GUI thread (a plan with
        GPUs takes milliseconds per model); the tables show the answer when it comes."""
        self._fit_generation += 1
        generation = self._fit_generation
        devices = list(self._devices)
        spec = load_spec(self._settings, self._settings["model_path"] or ".", n_ctx=self.ctx_box.value(),
                         kv_mode=str(self.kv_box.currentData()), context_budget=0)
        metas = {("disk", str(r.path)): r.meta for r in self._records if r.usable and r.meta is not None}
        metas.update({("hub", name): meta for name, meta in self._hub_metas.items()})

        def plan_all() -> dict[tuple[str, str], FitReport]:
            available = memory.available_ram()
            return {key: fit_report(meta, spec, available, devices)
                    for key, meta in metas.items()}

        self._fitter.run(plan_all, lambda reports: self._planned(generation, reports),
                         lambda err: self._say(f"The memory plan failed: {err}"), "Planning what fits")

    def _planned(self, generation: int, reports: dict[tuple[str, str], FitReport]) -> None:
        if generation != self._fit_generation:
            return  # the context or KV mode changed meanwhile: a newer plan is on its way
        self._reports = reports
        self._fill_disk()
        self._fill_hub()
        self.planned.emit()

    def _report(self, where: str, key: str) -> FitReport | None:
        return self._reports.get((where, key))

    def _devices_found(self, devices: list[Device]) -> None:
        self._devices = list(devices)
        self._show_machine()
        self._refit()

    def _show_machine(self) -> None:
        """What the fit is planned against: the RAM available now and each GPU's free memory."""
        places = [f"{fmt_bytes(memory.available_ram())} of RAM available"]
        places += [f"{d.name} {fmt_bytes(d.free)} free" for d in self._devices]
        self.machine_label.setText("Planned for: " + ", ".join(places))

    # --- on disk ----------------------------------------------------------------------------------------

    def places(self) -> Places:
        if self._places is not None:
            return self._places
        return Places.current(self._settings["model_folders"])

    def rescan(self) -> None:
        self.rescan_button.setEnabled(False)
        self.disk_note.setText("Looking for models…")
        places = self.places()
        self._background.run(lambda: scan(places), self._scanned, self._scan_failed, "Scanning for models")

    def _scanned(self, result: ScanResult) -> None:
        self.rescan_button.setEnabled(True)
        self._records = list(result.records)
        usable = len(result.usable)
        note = f"{usable} model{'s' * (usable != 1)} found in other tools' folders and yours (opened where "
        note += "they lie, nothing is copied)"
        if len(self._records) > usable:
            note += f"; {len(self._records) - usable} not offered (the reason is on their line)"
        if not self._records:
            note = "No GGUF models on disk yet: the Hugging Face Hub tab finds and downloads one."
        self.disk_note.setText(note + ("\n" + "\n".join(result.notes) if result.notes else ""))
        self._fill_disk()
        self._refit()

    def _scan_failed(self, err: Exception) -> None:
        self.rescan_button.setEnabled(True)
        self.disk_note.setText(f"The scan failed: {err}")

    def _fill_disk(self) -> None:
        table = self.disk_table
        table.setSortingEnabled(False)
        table.setRowCount(0)
        for record in self._records:
            row = table.rowCount()
            table.insertRow(row)
            cells = [_Item(record.name if record.usable else record.path.name, payload=record),
                     _Item(record.architecture), _Item(record.quant),
                     _Item(human_params(record.n_params), record.n_params),
                     _Item(fmt_bytes(record.size), record.size),
                     _Item(f"{record.n_ctx_train:,}" if record.n_ctx_train else "", record.n_ctx_train),
                     _Item("yes" if record.has_chat_template else "no" if record.usable else "")]
            report = self._report("disk", str(record.path))
            if record.usable:
                cells += _fit_cells(report, "planning…")
            else:
                cells += _fit_cells(None, f"not offered: {record.problem}")
            cells.append(_Item(f"{record.source}: {record.label}"))
            for column, cell in enumerate(cells):
                if not cell.toolTip():  # a Longest cell keeps its mode's figures
                    cell.setToolTip(str(record.path) if record.usable else record.details)
                table.setItem(row, column, cell)
        table.setSortingEnabled(True)
        self._update_load()

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder with GGUF models")
        if folder:
            folders = list(self._settings["model_folders"])
            if folder not in folders:
                self._settings.set("model_folders", [*folders, folder])
                self._settings.save()
            self.rescan()

    def selected_record(self) -> ModelRecord | None:
        rows = self.disk_table.selectionModel().selectedRows()
        if not rows:
            return None
        record = self.disk_table.item(rows[0].row(), 0).data(KEY)
        return record if isinstance(record, ModelRecord) and record.usable else None

    def select_path(self, path: Path) -> bool:
        """Select the disk table's row of ``path`` (after a download); False when it is not listed."""
        for row in range(self.disk_table.rowCount()):
            record = self.disk_table.item(row, 0).data(KEY)
            if isinstance(record, ModelRecord) and record.path == path:
                self.disk_table.selectRow(row)
                return True
        return False

    # --- the Hub ----------------------------------------------------------------------------------------

    def hub(self) -> Hub:
        return self._hub or Hub.from_env()

    def show_starters(self) -> None:
        """The starter list: well-known repos, unchecked (the Hub answers "not found" for a wrong id)."""
        self.repo_list.clear()
        for entry in starter_list():
            item = QListWidgetItem(f"{entry.repo_id}\n    {entry.note}")
            item.setData(KEY, entry.repo_id)
            item.setToolTip("From the starter list (not checked against the Hub when it was written)")
            self.repo_list.addItem(item)
        self.repo_note.setText("Well-known chat models to begin with; or search the Hub above.")

    def search(self) -> None:
        query = self.search_edit.text().strip()
        hub = self.hub()
        self.repo_note.setText(f"Searching the Hub for “{query}”…")
        self._background.run(lambda: search(query, hub=hub), self._searched, self._hub_failed, "Searching")

    def _searched(self, repos: list[HubRepo]) -> None:
        self.repo_list.clear()
        for repo in repos:
            item = QListWidgetItem(f"{repo.repo_id}\n    {repo.downloads:,} downloads"
                                   + (", gated" if repo.gated else ""))
            item.setData(KEY, repo.repo_id)
            self.repo_list.addItem(item)
        self.repo_note.setText(f"{len(repos)} GGUF repos found; choose one to see its files."
                               if repos else "No GGUF repos on the Hub match that.")

    def _repo_chosen(self, item: QListWidgetItem | None) -> None:
        self._generation += 1
        self._hub_models, self._hub_metas, self._header_errors = [], {}, {}
        self._fill_hub()
        if item is None:
            return
        repo_id = str(item.data(KEY))
        self.repo_note.setText(f"Asking the Hub for {repo_id}…")
        generation, hub = self._generation, self.hub()
        self._background.run(lambda: repo_models(repo_id, hub),
                             lambda models: self._listed(generation, repo_id, models),
                             lambda err: self._hub_failed(err, generation), "Listing a repo")

    def _listed(self, generation: int, repo_id: str, models: list[HubModel]) -> None:
        if generation != self._generation:
            return
        self._hub_models = models
        self.repo_note.setText(f"{repo_id}: {len(models)} GGUF model file{'s' * (len(models) != 1)}"
                               if models else f"{repo_id} has no GGUF files.")
        self._fill_hub()
        hub = self.hub()
        for model in models:
            if not model.problem:
                self._background.run(lambda m=model: read_header(m, hub),
                                     lambda meta, m=model: self._header_read(generation, m, meta),
                                     lambda err, m=model: self._header_failed(generation, m, err),
                                     "Reading a model's header")

    def _header_failed(self, generation: int, model: HubModel, err: Exception) -> None:
        """No header, no plan: the fit cell says so, and why (a gated repo, a damaged file, no network)."""
        if generation == self._generation:
            self._header_errors[_hub_key(model)] = str(err)
            self._fill_hub()

    def _header_read(self, generation: int, model: HubModel, meta: ModelMeta) -> None:
        if generation == self._generation:
            self._hub_metas[_hub_key(model)] = meta
            self._refit()

    def _hub_failed(self, err: Exception, generation: int | None = None) -> None:
        if generation is not None and generation != self._generation:
            return
        if isinstance(err, HubError) and err.kind == "not_found":
            self.repo_note.setText("not found: " + str(err))
        else:
            self.repo_note.setText(str(err))
        self.repo_note.setToolTip(getattr(err, "details", str(err)))

    def _fill_hub(self) -> None:
        table = self.hub_table
        selected = self.selected_hub_model()
        table.setSortingEnabled(False)
        table.setRowCount(0)
        for model in self._hub_models:
            row = table.rowCount()
            table.insertRow(row)
            shards = f" (+{len(model.files) - 1} shards)" if len(model.files) > 1 else ""
            cells = [_Item(model.name + shards, payload=model), _Item(model.quant),
                     _Item(fmt_bytes(model.size), model.size)]
            if model.problem:
                cells += _fit_cells(None, f"not offered: {model.problem}")
            elif _hub_key(model) in self._header_errors:
                cells += _fit_cells(None, "unknown: its header could not be read")
                cells[HUB_FIT].setToolTip(self._header_errors[_hub_key(model)])
            elif _hub_key(model) not in self._hub_metas:
                cells += _fit_cells(None, "reading its header…")
            else:
                cells += _fit_cells(self._report("hub", _hub_key(model)), "planning…")
            for column, cell in enumerate(cells):
                table.setItem(row, column, cell)
            if selected is not None and model.name == selected.name:
                table.selectRow(row)
        table.setSortingEnabled(True)
        self._update_download()

    def selected_hub_model(self) -> HubModel | None:
        rows = self.hub_table.selectionModel().selectedRows()
        if not rows:
            return None
        model = self.hub_table.item(rows[0].row(), 0).data(KEY)
        return model if isinstance(model, HubModel) else None

    def select_hub_file(self, name: str) -> bool:
        for row in range(self.hub_table.rowCount()):
            model = self.hub_table.item(row, 0).data(KEY)
            if isinstance(model, HubModel) and model.name == name:
                self.hub_table.selectRow(row)
                return True
        return False

    # --- downloads --------------------------------------------------------------------------------------

    def _update_download(self) -> None:
        model = self.selected_hub_model()
        busy = self.download is not None and self.download.running
        self.download_button.setEnabled(model is not None and not model.problem and not busy)

    def start_download(self) -> None:
        model = self.selected_hub_model()
        if model is None or model.problem:
            return
        try:
            self.download = downloads.start(model.repo_id, model.name, self.places(), self.hub())
        except HubError as err:
            self._say(str(err), err.details)
            return
        self.downloaded = None
        self.progress.setValue(0)
        self.progress_label.setText(f"Starting the download of {model.name}…")
        self.cancel_button.setEnabled(True)
        self._update_download()
        self._update_load()
        self._timer.start()

    def cancel_download(self) -> None:
        if self.download is not None and self.download.running:
            self.download.cancel()
            self.progress_label.setText("Cancelled; downloading it again goes on where it stopped.")
        self._download_ended()

    def _poll_download(self) -> None:
        job = self.download
        if job is None:
            self._timer.stop()
            return
        if job.poll() and job.progress.total:
            self.progress.setValue(int(1000 * job.progress.done / job.progress.total))
            self.progress_label.setText(job.progress.describe())
        if job.running:
            return
        if job.state == "done" and job.path is not None:
            self.downloaded = job.path
            self.progress.setValue(1000)
            self.progress_label.setText(f"Downloaded and checked (sha256): {job.path.name}")
            self._say(f"{job.path.name} is in the Hugging Face cache; Load opens it.")
            self.rescan()
        elif job.state == "failed" and job.error is not None:
            self.progress_label.setText("Failed")
            self._say(str(job.error), job.error.details)
        self._download_ended()

    def _download_ended(self) -> None:
        self._timer.stop()
        self.cancel_button.setEnabled(False)
        self._update_download()
        self._update_load()

    # --- loading ----------------------------------------------------------------------------------------

    def chosen_path(self) -> Path | None:
        if self.tabs.currentIndex() == 0:
            record = self.selected_record()
            return record.path if record is not None else None
        return self.downloaded

    def _update_load(self) -> None:
        self.load_button.setEnabled(self.chosen_path() is not None)

    def _load(self) -> None:
        path = self.chosen_path()
        if path is not None:
            self.model_chosen.emit(path)
            self.close()

    def _say(self, text: str, details: str = "") -> None:
        self.status.setText(text)
        self.status.setToolTip(details if details != text else "")

    def shutdown(self) -> None:
        """The app is quitting: stop a download (its partial file is resumed next time)."""
        if self.download is not None and self.download.running:
            self.download.cancel()
        self._timer.stop()

