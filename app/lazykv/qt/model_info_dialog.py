"""What a model is: architecture, size, trained context, head sizes and the KV cache modes it can use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from lazykv.core.engine.memory import fmt_bytes
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import HOST_CPU, Plan

if TYPE_CHECKING:
    from lazykv.core.engine.chat_template import ChatTemplateChoice


def describe(meta: ModelMeta, template: ChatTemplateChoice | None = None) -> list[tuple[str, str]]:
    """What the model is; ``template``: the chat format it was loaded with and why (None: not loaded)."""
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
        ("Chat template", template.words if template is not None else "From the model file"
         if meta.has_chat_template else "None in the model file: a format is chosen when it loads"),
    ]
    if meta.sliding_window:
        rows.insert(7, ("Sliding window", f"{meta.sliding_window} tokens (iSWA)"))
    return rows


def describe_plan(plan: Plan, note: str = "") -> list[tuple[str, str]]:
    """The memory plan the model was loaded with: GPU layers and why, then each place's bytes."""

    def parts(weights: int, kv: int, compute: int) -> str:
        return f"weights {fmt_bytes(weights)}, KV cache {fmt_bytes(kv)}, buffers {fmt_bytes(compute)}"

    most = plan.n_layer + 1 if plan.n_layer else 0
    why = plan.reason[:1].upper() + plan.reason[1:]
    rows = [("GPU layers", f"{plan.n_gpu_layers} of {most}. {why}." + (f" {note}" if note else "")),
            (HOST_CPU[:1].upper() + HOST_CPU[1:], parts(plan.host.weights, plan.host.kv, plan.host.compute))]
    for d in plan.devices:
        memory = (f"{fmt_bytes(d.device.free)} free of {fmt_bytes(d.device.total)} before loading"
                  if d.device.total else "its memory is not reported")
        about = f", {d.device.description}" if d.device.description else ""
        rows.append((f"{d.device.name}{about}", f"{parts(d.weights, d.kv, d.compute)} ({memory})"))
    return rows


class ModelInfoDialog(QDialog):
    def __init__(self, meta: ModelMeta, parent: QWidget | None = None, plan: Plan | None = None,
                 note: str = "", template: ChatTemplateChoice | None = None) -> None:
        """``plan``: the memory plan the model was loaded with (shown after what the model is);
        ``template``: the chat format it was loaded with, and why."""
        super().__init__(parent)
        self.setWindowTitle(f"Model: {meta.name}")
        self.setObjectName("model-info")
        form = QFormLayout()
        rows = describe(meta, template) + (describe_plan(plan, note) if plan is not None else [])
        for label, value in rows:
            field = QLabel(value)
            field.setTextFormat(Qt.TextFormat.PlainText)  # GGUF metadata is text, never markup
            field.setWordWrap(True)
            form.addRow(f"{label}:", field)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
