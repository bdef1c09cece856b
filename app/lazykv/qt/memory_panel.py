"""The memory panel: KV cache phase and bytes, model weights, process RSS, a history graph, the estimate.

The KV cache and the weights are split into host memory and each device's own memory (remote
backends, GPUs), named as the engine names them."""

from __future__ import annotations

from collections import deque

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QFormLayout, QLabel, QProgressBar, QSizePolicy, QVBoxLayout, QWidget

from lazykv.core.engine.memory import CTX_PADDING, ContextPlan, DeviceMemory, Fit, fmt_bytes, placed
from lazykv.core.engine.planner import Estimate
from lazykv.core.engine.types import KvStatus, ModelInfo
from lazykv.core.kinds import KvPhase
from lazykv.qt.kv_words import rung_line

HISTORY_SAMPLES = 120
FIT_COLORS = {Fit.GREEN: "#1a7f37", Fit.YELLOW: "#b08800", Fit.RED: "#cf222e"}
_RSS_COLOR = QColor("#0969da")
_KV_COLOR = QColor("#8250df")


class HistoryGraph(QWidget):
    """Process RSS and KV bytes in use over the last HISTORY_SAMPLES samples."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.samples: deque[tuple[int, int]] = deque(maxlen=HISTORY_SAMPLES)
        self.setMinimumHeight(90)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def add(self, rss: int, kv_used: int) -> None:
        self.samples.append((rss, kv_used))
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        area = QRectF(self.rect()).adjusted(1, 14, -1, -1)
        palette = self.palette()  # light or dark theme
        p.fillRect(area, palette.color(QPalette.ColorRole.Base))
        p.setPen(QPen(palette.color(QPalette.ColorRole.Mid)))
        p.drawRect(area)
        top = max((max(s) for s in self.samples), default=0)
        p.setPen(QPen(palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText)))
        font = p.font()
        font.setPointSizeF(max(6.0, font.pointSizeF() - 2))
        p.setFont(font)
        p.drawText(QRectF(0, 0, self.width(), 14), Qt.AlignmentFlag.AlignLeft, f"max {fmt_bytes(top)}")
        p.setPen(QPen(_RSS_COLOR))
        p.drawText(QRectF(0, 0, self.width() - 60, 14), Qt.AlignmentFlag.AlignRight, "RSS")
        p.setPen(QPen(_KV_COLOR))
        p.drawText(QRectF(0, 0, self.width() - 4, 14), Qt.AlignmentFlag.AlignRight, "KV in use")
        if len(self.samples) < 2 or top <= 0:
            return
        for column, color in ((0, _RSS_COLOR), (1, _KV_COLOR)):
            path = QPainterPath()
            for i, sample in enumerate(self.samples):
                x = area.left() + area.width() * i / (HISTORY_SAMPLES - 1)
                y = area.bottom() - area.height() * sample[column] / (1.1 * top)
                if i == 0:
                    path.moveTo(QPointF(x, y))
                else:
                    path.lineTo(QPointF(x, y))
            p.setPen(QPen(color, 1.6))
            p.drawPath(path)


class MemoryPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.status: KvStatus | None = None
        self.memory: tuple[DeviceMemory, ...] = ()  # the loaded model's, per place
        # the engine counts a context's conversions for its whole life: those before the chat on screen
        # was put there are not its own
        self._conversions_before = 0
        self.phase_label = QLabel("no model")
        self.phase_label.setObjectName("kv-phase")
        self.rung_label = QLabel("–")  # the rung in use and the next one
        self.rung_label.setObjectName("kv-rung")
        self.cells_bar = QProgressBar()  # the figures are in the line above: no text under the fill
        self.cells_bar.setTextVisible(False)
        self.cells_bar.setFixedHeight(8)
        self.kv_label = QLabel("–")
        self.weights_label = QLabel("–")
        self.rss_label = QLabel("–")
        self.devices_label = QLabel("–")  # each device: free/total, and the model's weights/KV/buffers on it
        self.devices_label.setObjectName("devices")
        self.devices_label.setTextFormat(Qt.TextFormat.PlainText)  # names from drivers, servers
        self.conversion_label = QLabel("none yet")
        self.graph = HistoryGraph()
        self.estimate_label = QLabel("")
        for label in (self.phase_label, self.rung_label, self.kv_label, self.weights_label,
                      self.conversion_label, self.estimate_label, self.devices_label):
            label.setWordWrap(True)  # the dock stays as narrow as the user makes it

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # a narrow dock: value under its name
        form.addRow("Precision", self.phase_label)
        form.addRow("Filled", self.rung_label)
        form.addRow("", self.cells_bar)
        form.addRow("Context memory", self.kv_label)
        form.addRow("Compacted", self.conversion_label)
        form.addRow("Model weights", self.weights_label)
        form.addRow("App memory", self.rss_label)
        form.addRow("Devices", self.devices_label)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.graph)
        layout.addWidget(self.estimate_label)
        layout.addStretch()

    def new_chat(self) -> None:
        """Another chat is on screen from now on: "Compacted" counts its own steps only."""
        self._conversions_before = self.status.n_steps if self.status is not None else 0
        if self.status is not None:
            self._show_conversions(self.status)

    def set_model(self, info: ModelInfo) -> None:
        self._conversions_before = 0  # a new context counts from nought
        self.memory = info.memory
        weights = placed((p.place, p.weights) for p in self.memory) or fmt_bytes(info.file_size)
        self.weights_label.setText(f"{weights} ({info.name})")
        self.devices_label.setText(devices_text(info))

    def set_status(self, status: KvStatus) -> None:
        self.status = status
        self.phase_label.setText(_phase_text(status) + _mode_note(status))
        self.rung_label.setText(rung_line(status))
        self.cells_bar.setRange(0, max(1, status.n_cells_capacity))
        self.cells_bar.setValue(min(status.n_cells_used, status.n_cells_capacity))
        self.cells_bar.setFormat(f"{status.n_cells_used} / {status.n_cells_capacity} ({_storage(status)})")
        details = (f"Engine: {status.n_cells_used} / {status.n_cells_capacity} cells ({_storage(status)}); "
                   f"KV cache {status.kv_mode}, phase {status.phase}")
        for widget in (self.phase_label, self.rung_label, self.cells_bar):
            widget.setToolTip(details)
        where = placed((p.place, p.kv) for p in self.memory)
        self.kv_label.setText(f"{fmt_bytes(status.kv_bytes_used)} in use of {fmt_bytes(status.kv_bytes)}"
                              + (f": {where}" if where else ""))
        self._show_conversions(status)

    def _show_conversions(self, status: KvStatus) -> None:
        if status.n_steps < self._conversions_before:  # a context made since (a model loaded)
            self._conversions_before = 0
        n = status.n_steps - self._conversions_before
        if n:
            self.conversion_label.setText(f"{n}× (last {1000 * status.last_step_s:.0f} ms)")
        elif not status.kv_mode.is_lazy:
            self.conversion_label.setText("not a lazy cache")
        else:
            self.conversion_label.setText("none yet")

    def sample(self, rss: int) -> None:
        self.rss_label.setText(fmt_bytes(rss))
        self.graph.add(rss, self.status.kv_bytes_used if self.status else 0)

    def set_estimate(self, title: str, estimate: Estimate | None, error: str = "",
                     plan: ContextPlan | None = None) -> None:
        """Show what loading a model would need, coloured against the RAM available, and (``plan``) how
        many tokens each KV mode holds in the same KV memory."""
        if estimate is None:
            self.estimate_label.setText(f"<b>{title}</b><br>{error}" if error else "")
            return
        color = FIT_COLORS[estimate.fit]
        rungs = f"<br>{rungs_text(plan)}" if plan is not None and plan.rungs else ""
        self.estimate_label.setText(
            f"<b>{title}</b><br><span style='color:{color}'>● {estimate.fit.value}</span>: "
            f"{estimate.summary()}{rungs}"
        )
        self.estimate_label.setToolTip(tokens_per_mode(plan) if plan is not None else "")  # on demand


def devices_text(info: ModelInfo) -> str:
    """Each device the model was offered: its memory (free of total, before loading), and the weights, KV
    cache and buffers the engine put on it; or that the model runs on the CPU, and why."""
    used = {m.device: m for m in info.memory if not m.host}
    lines = []
    for device in info.devices:
        on = used.get(device.name)
        memory = (f"{fmt_bytes(device.free)} free of {fmt_bytes(device.total)}" if device.total
                  else "memory not reported")
        held = (f"weights {fmt_bytes(on.weights)}, KV {fmt_bytes(on.kv)}, buffers {fmt_bytes(on.compute)}"
                if on is not None else "nothing of this model")
        about = f" ({device.description})" if device.description and device.description != device.name else ""
        lines.append(f"{device.name}{about}: {memory}; {held}")
    plan = info.plan
    if plan is not None:
        lines.append(f"{plan.n_gpu_layers} of {plan.n_layer + 1 if plan.n_layer else 0} layers on the GPU: "
                     f"{plan.reason}")
    if info.plan_note:
        lines.append(info.plan_note)
    return "\n".join(lines) if lines else "none: the model runs on the CPU"


def tokens_per_mode(plan: ContextPlan) -> str:
    """``In 24.0 MiB of KV memory: f16 1,024 · q8_0 2,048 · lazy 2,048 · ladder 4,096 tokens`` (rich text;
    the mode chosen in bold; a mode capped by the model's own limit says so), then the chosen mode's tokens
    per GiB and quality (ContextPlan.figures)."""
    parts = []
    for mode, n in plan.per_mode.items():
        held = f"{n:,}" if n else f"under {CTX_PADDING}"  # the engine's smallest context: 256 tokens
        text = f"{mode} {held}" + (" (the model's limit)" if plan.at_limit(mode) else "")
        parts.append(f"<b>{text}</b>" if mode is plan.kv_mode else text)
    line = f"In {fmt_bytes(plan.kv_budget)} of KV memory: {' · '.join(parts)} tokens<br>{plan.figures()}"
    return f"{line}<br>{rungs_text(plan)}" if plan.rungs else line


def rungs_text(plan: ContextPlan) -> str:
    """``ladder levels: 16-bit up to 144 tokens, then 8-bit up to 256, then 4-bit up to 512``: the rungs
    the memory panel will show once loaded, from the same planner (memory.rung_cells)."""
    (first, n_first), *rest = plan.rungs
    rungs = [f"{first.words} up to {n_first:,} tokens", *(f"{p.words} up to {n:,}" for p, n in rest)]
    return f"{plan.kv_mode} levels: {', then '.join(rungs)}"


def _phase_text(status: KvStatus) -> str:
    if status.phase is KvPhase.CONVERTING:
        return f"compacting to {(status.target or KvPhase.Q8_0).words}…"
    return status.phase.label


def _storage(status: KvStatus) -> str:
    """What the cells bar counts: a lazy cache's rung below its last is a view over the allocation."""
    return f"{status.phase} view" if status.next_rung is not None else str(status.phase)


def _mode_note(status: KvStatus) -> str:
    rung = status.next_rung
    if rung is not None:
        return f" — {status.kv_mode}: goes to {rung.words} at {status.n_cells_capacity:,} tokens"
    return ""
