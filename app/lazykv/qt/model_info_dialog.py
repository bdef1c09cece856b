"""What a model is: architecture, size, trained context, head sizes and the KV cache modes it can use."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from lazykv.core.engine.memory import fmt_bytes
from lazykv.core.engine.model_meta import ModelMeta


def describe(meta: ModelMeta) -> list[tuple[str, str]]:
    support = meta.kv_support(flash_attn=True)
    kv = "f16, q8_0, lazy q8_0 and ladder" if support.lazy else (
        "f16 only: " + support.reason if support.f16 else "none: " + support.reason)
    rows = [
        ("Name", meta.name),
        ("File", f"{meta.path} ({fmt_bytes(meta.file_size)})"),
        ("Architecture", meta.architecture),
        ("Parameters", f"{meta.n_params / 1e6:,.1f} M"),
        ("Trained context", f"{meta.n_ctx_train:,} tokens"),
        ("Layers", str(meta.n_layer)),
        ("Heads (KV heads)", f"{meta.n_head} ({meta.n_head_kv})"),
        ("Head size (K / V)", f"{meta.head_k} / {meta.head_v}"),
        ("KV cache modes", kv),
        ("Chat template", "from the model file" if meta.has_chat_template else "none (ChatML is used)"),
    ]
    if meta.sliding_window:
        rows.insert(7, ("Sliding window", f"{meta.sliding_window} tokens (iSWA)"))
    return rows


class ModelInfoDialog(QDialog):
    def __init__(self, meta: ModelMeta, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Model: {meta.name}")
        self.setObjectName("model-info")
        form = QFormLayout()
        for label, value in describe(meta):
            field = QLabel(value)
            field.setTextFormat(Qt.TextFormat.PlainText)  # GGUF metadata is text, never markup
            field.setWordWrap(True)
            form.addRow(f"{label}:", field)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
