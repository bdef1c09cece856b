"""The settings dialog, derived from the declaration in core.settings (one widget per setting)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, SignalInstance
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import ContextPlan, Fit, MiB, fmt_bytes, kv_bytes, window_bytes
from lazykv.core.engine.model_meta import CTX_PADDING, ModelMeta
from lazykv.core.engine.planner import Device
from lazykv.core.engine.remote import parse_endpoint_text
from lazykv.core.kinds import KvMode, SettingKind
from lazykv.core.settings import LOAD_SETTINGS, SETTINGS, SETTINGS_BY_NAME, Setting, Settings, load_spec
from lazykv.qt.markdown import plain_rich_text
from lazykv.qt.memory_panel import FIT_COLORS, tokens_per_mode


class SettingsDialog(QDialog):
    """Edits a copy of the values; ``changed()`` lists what differs once accepted.

    Each setting's editor comes from ``EDITORS`` by its kind (path lists are never in the dialog)."""

    def __init__(
        self, settings: Settings, meta: ModelMeta | None = None, parent: QWidget | None = None,
        keyring_works: bool = True, gpus: Sequence[Device] = (), tools_page: QWidget | None = None,
    ) -> None:
        """``meta``: the loaded model's (None: no model loaded); ``keyring_works``: False when the OS
        keyring failed this session (its protection scheme is then offered disabled); ``gpus``: this
        machine's GPUs as the last load found them (the estimate plans the GPU layers on them);
        ``tools_page``: Settings > Tools (qt.tools_page): with it the dialog has tabs, and the "Tools"
        settings sit under that page."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settings-dialog")
        self._settings = settings
        self._meta = meta
        self._gpus = tuple(gpus)
        self._editors: dict[str, Editor] = {}
        self.editors: dict[str, QWidget] = {}

        columns = QHBoxLayout()
        left, right = QVBoxLayout(), QVBoxLayout()
        tools = QVBoxLayout() if tools_page is not None else None
        groups: dict[str, QFormLayout] = {}
        for setting in SETTINGS:
            if not setting.in_dialog:
                continue
            if setting.group not in groups:
                box = QGroupBox(setting.group)
                groups[setting.group] = QFormLayout(box)
                column = tools if tools is not None and setting.group == "Tools" else right
                (left if setting.group in ("Engine", "Chat") else column).addWidget(box)
            self._add_row(groups[setting.group], setting, settings[setting.name])
            if setting.name == "context_budget_mb":  # what the budget (or the context length) holds, per mode
                self.budget_label = QLabel()
                self.budget_label.setObjectName("settings-budget-tokens")
                self.budget_label.setWordWrap(True)
                self.budget_label.setTextFormat(Qt.TextFormat.RichText)
                groups[setting.group].addRow(self.budget_label)
        left.addStretch()
        self.estimate_label = QLabel()
        self.estimate_label.setWordWrap(True)
        self.estimate_label.setObjectName("settings-estimate")
        right.addWidget(self.estimate_label)
        right.addStretch()
        self.reload_note = QLabel(RELOAD_NOTE)
        self.reload_note.setObjectName("settings-reload-note")
        self.reload_note.setWordWrap(True)
        self.reload_note.hide()
        columns.addLayout(left, 1)
        columns.addLayout(right, 1)

        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        for editor in self._editors.values():
            editor.changed.connect(self._update_ok)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(self.restore_defaults)
        layout = QVBoxLayout(self)
        if tools is None:
            layout.addLayout(columns)
        else:
            self.tabs = QTabWidget()
            general, page = QWidget(), QWidget()
            general.setLayout(columns)
            tools.insertWidget(0, tools_page, 1)
            page.setLayout(tools)
            self.tabs.addTab(general, "General")
            self.tabs.addTab(page, "Tools")
            layout.addWidget(self.tabs)
        layout.addWidget(self.reload_note)
        layout.addWidget(buttons)

        if not keyring_works:
            _disable_choice(self.editors["snapshot_encryption"], "keyring",
                            "Your system's keyring is not available in this session.")
        self._update_kv_choices()
        self._update_estimate()
        self._update_ok()
        for name in ("n_ctx", "kv_mode", "flash_attn", "rpc_servers", "rpc_layers", "context_budget_mb",
                     "n_gpu_layers", "gpu_memory_mb", "kv_recent"):
            self._editors[name].changed.connect(self._on_engine_change)
        if meta is not None:  # a model is loaded: say before OK that applying reloads it
            for setting in SETTINGS:
                if setting.reloads_engine and setting.name in self._editors:
                    self._editors[setting.name].changed.connect(self._update_reload_note)

    def value(self, name: str) -> Any:
        return self._editors[name].get()

    def changed(self) -> dict[str, Any]:
        """Settings whose edited value differs from the current one."""
        return {name: e.get() for name, e in self._editors.items() if e.get() != self._settings[name]}

    def set_value(self, name: str, value: Any) -> None:
        self._editors[name].set(value)

    def restore_defaults(self) -> None:
        """Every setting to its default, except a choice this session cannot use (e.g. the keyring
        scheme without a keyring): that one stays as it is."""
        for setting in SETTINGS:
            if setting.in_dialog and _choice_allowed(self.editors[setting.name], setting.default):
                self.set_value(setting.name, setting.default)

    def _update_ok(self) -> None:
        """OK waits until every editor holds a valid value (each says what is wrong under itself) and a
        context memory budget holds the smallest context (said under it)."""
        plan = self._plan()
        too_small = plan is not None and plan.n_ctx == 0
        self.ok_button.setEnabled(not too_small and not any(e.problem() for e in self._editors.values()))

    def _update_reload_note(self) -> None:
        self.reload_note.setVisible(any(s.reloads_engine for s in SETTINGS if s.name in self.changed()))

    def _add_row(self, form: QFormLayout, setting: Setting, value: Any) -> None:
        """The setting's label and editor, with the editor's full-width notes above and below."""
        editor = EDITORS[setting.kind](setting)
        self._editors[setting.name] = editor
        self.editors[setting.name] = editor.widget
        editor.set(value)
        editor.widget.setToolTip(setting.description)
        label = QLabel(setting.label)
        label.setToolTip(setting.description)
        if editor.above is not None:
            form.addRow(editor.above)
        form.addRow(label, editor.widget)
        if editor.below is not None:
            form.addRow(editor.below)

    def _on_engine_change(self) -> None:
        self._update_kv_choices()
        self._update_estimate()
        self._update_ok()

    def _update_kv_choices(self) -> None:
        """KV modes this model cannot run are disabled, with the reason as their tooltip."""
        if self._meta is None:
            return
        combo = self.editors["kv_mode"]
        assert isinstance(combo, QComboBox)
        support = self._meta.kv_support(flash_attn=self.value("flash_attn"))
        for row in range(combo.count()):
            item = _choice_item(combo, row)
            allowed = support.allows(combo.itemData(row))
            item.setEnabled(allowed)
            reason = plain_rich_text(f"Not possible for this model: {support.reason}")
            item.setToolTip("" if allowed else reason)
        if not support.allows(combo.currentData()):
            combo.setCurrentIndex(combo.findData(str(KvMode.F16)))

    def _plan(self) -> ContextPlan | None:
        """The context the values would load (None: no model to measure it on)."""
        if self._meta is None:
            return None
        return self._spec().context(self._meta)

    def _spec(self) -> LoadSpec:
        """What the values would load (the model measured)."""
        assert self._meta is not None
        return load_spec({name: self.value(name) for name in LOAD_SETTINGS}, self._meta.path)

    def _update_budget(self, plan: ContextPlan | None) -> None:
        """The context length is unused while a budget is set; under the budget, what it (or the context
        length's memory) holds in each KV mode."""
        budget = self.value("context_budget_mb")
        self.editors["n_ctx"].setEnabled(budget == 0)
        self.editors["n_ctx"].setToolTip("Unused: the context memory budget sets the length." if budget else
                                         SETTINGS_BY_NAME["n_ctx"].description)
        if plan is None:
            self.budget_label.setText("Load a model to see how many tokens fit in each KV mode.")
        elif budget and plan.n_ctx == 0:
            need = fmt_bytes(kv_bytes(self._meta, CTX_PADDING, plan.kv_mode, self._spec().lazy_window)) \
                if self._meta else ""
            self.budget_label.setText(
                f"<span style='color:{FIT_COLORS[Fit.RED]}'>{fmt_bytes(budget * MiB)} holds fewer than "
                f"{CTX_PADDING} tokens with this KV cache: {CTX_PADDING} tokens need {need}.</span><br>"
                f"{tokens_per_mode(plan)}")
        else:
            self.budget_label.setText(tokens_per_mode(plan) + self._window_cost(plan))

    def _window_cost(self, plan: ContextPlan) -> str:
        """What the recent window and the sinks take, when the KV mode keeps them."""
        if self._meta is None or not plan.kv_mode.is_lazy or plan.n_ctx <= 0:
            return ""
        spec = self._spec()
        window = spec.lazy_window
        if window <= 0:
            return ""
        cost = window_bytes(self._meta, plan.n_ctx, plan.kv_mode, window)
        share = cost / kv_bytes(self._meta, plan.n_ctx, plan.kv_mode, window)
        part = f"{share:.0%}" if share >= 0.01 else "under 1%"
        return (f"<br>16-bit beside the cache: {spec.window_words(plan.n_ctx)} take {fmt_bytes(cost)} "
                f"({part} of the KV memory).")

    def _update_estimate(self) -> None:
        plan = self._plan()
        self._update_budget(plan)
        if plan is None or self._meta is None:
            self.estimate_label.setText("")
            return
        spec = self._spec().with_(n_ctx=max(plan.n_ctx, CTX_PADDING), context_budget=0)
        est = spec.estimate(self._meta, self._gpus)
        color = FIT_COLORS[est.fit]
        self.estimate_label.setText(
            f"<b>{html.escape(self._meta.path.name)}</b> with these settings ({plan.n_ctx:,} tokens)<br>"
            f"<span style='color:{color}'>● {est.fit.value}</span>: {est.summary()}"
        )
        self.estimate_label.setTextFormat(Qt.TextFormat.RichText)


RELOAD_NOTE = ("OK reloads the model: its context memory is emptied, and the next reply reads this chat "
               "again (a long chat takes a moment).")


def _choice_item(combo: QComboBox, row: int) -> QStandardItem:
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    return model.item(row)


def _disable_choice(combo: QWidget, value: str, reason: str) -> None:
    assert isinstance(combo, QComboBox)
    item = _choice_item(combo, combo.findData(value))
    item.setEnabled(False)
    item.setToolTip(plain_rich_text(reason))


def _choice_allowed(editor: QWidget, value: Any) -> bool:
    """Whether ``value`` may be chosen in ``editor`` (only a choice's items can be disabled)."""
    if not isinstance(editor, QComboBox):
        return True
    row = editor.findData(str(value))
    return row >= 0 and _choice_item(editor, row).isEnabled()


@dataclass(frozen=True)
class Editor:
    """One setting's widget with its getter, setter and change signal."""

    widget: QWidget
    get: Callable[[], Any]
    set: Callable[[Any], None]
    changed: SignalInstance
    problem: Callable[[], str] = lambda: ""  # why the value typed cannot be used ("": it can)
    above: QWidget | None = None  # full-width rows of the form around the editor's own
    below: QWidget | None = None


def _bool_editor(setting: Setting) -> Editor:
    box = QCheckBox()
    return Editor(box, box.isChecked, lambda v: box.setChecked(bool(v)), box.toggled)


def _int_editor(setting: Setting) -> Editor:
    spin = QSpinBox()
    spin.setRange(int(setting.minimum or 0), int(setting.maximum or 2**31 - 1))
    spin.setSingleStep(int(setting.step or 1))
    spin.setSpecialValueText(setting.special)  # shown instead of the minimum ("0 = automatic")
    return Editor(spin, spin.value, spin.setValue, spin.valueChanged)


def _float_editor(setting: Setting) -> Editor:
    spin = QDoubleSpinBox()
    spin.setRange(setting.minimum or 0.0, setting.maximum or 1e9)
    spin.setSingleStep(setting.step or 0.1)
    spin.setDecimals(2)
    spin.setSpecialValueText(setting.special)
    return Editor(spin, spin.value, spin.setValue, spin.valueChanged)


def _choice_editor(setting: Setting) -> Editor:
    """A combo box; with ``choice_notes``, the note of the choice shown is the line under it."""
    combo = QComboBox()
    for choice, label in setting.choices:
        combo.addItem(label, str(choice))
    note = None
    if setting.choice_notes:
        notes = {str(value): text for value, text in setting.choice_notes}
        note = QLabel()
        note.setObjectName(f"{setting.name}-note")
        note.setWordWrap(True)
        note.setTextFormat(Qt.TextFormat.PlainText)
        combo.currentIndexChanged.connect(lambda _=0: note.setText(notes.get(combo.currentData(), "")))
        note.setText(notes.get(combo.currentData(), ""))
    return Editor(combo, combo.currentData, lambda v: combo.setCurrentIndex(max(0, combo.findData(str(v)))),
                  combo.currentIndexChanged, below=note)


def _text_editor(setting: Setting) -> Editor:
    edit = QPlainTextEdit()
    edit.setFixedHeight(3 * edit.fontMetrics().lineSpacing() + 12)
    return Editor(edit, edit.toPlainText, edit.setPlainText, edit.textChanged)


def _line_editor(setting: Setting) -> Editor:
    line = QLineEdit()
    return Editor(line, line.text, line.setText, line.textChanged)


def _endpoint_list_editor(setting: Setting) -> Editor:
    """One host:port per line, the explanation above; what is wrong with an entry is said under the list
    (OK waits for it)."""
    hint = QLabel(setting.description)  # its own line breaks: a wrapped label in a form gets squeezed
    hint.setObjectName(f"{setting.name}-hint")
    edit = QPlainTextEdit()
    edit.setObjectName(f"{setting.name}-edit")
    edit.setPlaceholderText("192.168.1.20:50052")
    edit.setFixedHeight(3 * edit.fontMetrics().lineSpacing() + 12)
    problems = QLabel()
    problems.setObjectName(f"{setting.name}-problems")
    problems.setTextFormat(Qt.TextFormat.PlainText)
    problems.setStyleSheet(f"color: {FIT_COLORS[Fit.RED]}")
    problems.hide()

    def show_problems() -> None:
        found = parse_endpoint_text(edit.toPlainText()).problems
        problems.setText("\n".join(found))
        problems.setVisible(bool(found))

    edit.textChanged.connect(show_problems)
    return Editor(
        edit,
        lambda: parse_endpoint_text(edit.toPlainText()).endpoints,
        lambda v: edit.setPlainText("\n".join(v)),
        edit.textChanged,
        lambda: "\n".join(parse_endpoint_text(edit.toPlainText()).problems),
        above=hint,
        below=problems,
    )


EDITORS: dict[SettingKind, Callable[[Setting], Editor]] = {
    SettingKind.BOOL: _bool_editor,
    SettingKind.INT: _int_editor,
    SettingKind.FLOAT: _float_editor,
    SettingKind.CHOICE: _choice_editor,
    SettingKind.TEXT: _text_editor,
    SettingKind.STR: _line_editor,
    SettingKind.ENDPOINT_LIST: _endpoint_list_editor,
}
