"""The banner of a long engine task: a lazy cache's conversion with its progress (and its duration
after), or re-reading a conversation, which can be stopped."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QWidget

from lazykv.core.engine.types import KvStatus, StepEvent
from lazykv.core.kinds import StepStage
from lazykv.qt.notice_banner import Banner

BAR_MAX_WIDTH, BAR_MIN_WIDTH = 220, 60  # px: the progress bar's
SHOW_DONE_MS = 2500  # the finished note stays this long (a conversion itself often takes < 100 ms)


def compacted_text(event: StepEvent) -> str:
    """The one sentence for a finished conversion step (banner and status bar)."""
    return (f"Context memory compacted to {event.target.words} in {1000 * event.duration_s:.0f} ms at token "
            f"{event.n_cells}")


def marker_label(event: StepEvent, during_reply: bool = False, before: KvStatus | None = None) -> str:
    """The line the transcript shows where the cache went a step down (to 8-bit, to 4-bit): under the
    message it followed, or under the reply it happened in. ``before``: the cache's status before a
    step taken while text was read; taken before the rung in use was full, it means that what was
    read did not fit in it (e.g. a whole conversation read again after a model reload): said so."""
    where = "during this reply" if during_reply else "here"
    if before is not None and before.rungs and event.n_cells < before.n_cells_capacity:
        level = f"the {before.phase.words} level ({before.n_cells_capacity:,} tokens)"
        if event.n_cells == 0:
            return (f"Context memory went to {event.target.words} before the conversation was read: it no "
                    f"longer fit {level}")
        return (f"Context compacted to {event.target.words} {where} (at token {event.n_cells:,}): what came "
                f"next did not fit the rest of {level}")
    return f"Context compacted to {event.target.words} {where} (at token {event.n_cells})"


class StepBanner(Banner):
    """Progress of a long engine task; ``stop_requested`` when its Stop button is pressed (only shown
    for tasks that can stop: re-reading a conversation)."""

    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("conversion-banner", parent)
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setRange(0, 100)
        self.bar.setMaximumWidth(BAR_MAX_WIDTH)
        self.bar.setMinimumWidth(BAR_MIN_WIDTH)
        # in a narrow window the bar gives way to the sentence (its width shared, 3 to 1)
        self.bar.setSizePolicy(QSizePolicy.Policy.Ignored, self.bar.sizePolicy().verticalPolicy())
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("banner-stop")
        self.stop_button.clicked.connect(self.stop_requested.emit)
        self.stop_button.hide()
        self.details_button = QPushButton("Details")  # a note's technical account, on demand
        self.details_button.setObjectName("banner-details")
        self.details_button.clicked.connect(self._show_details)
        self.details_button.hide()
        self._details = ""
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addWidget(self.label, 3)
        layout.addWidget(self.bar, 1)
        layout.addWidget(self.stop_button)
        layout.addWidget(self.details_button)
        self._hide_timer = QTimer(self)
        self._hide_timer.setSingleShot(True)
        self._hide_timer.timeout.connect(self.hide)
        self.hide()

    def show_progress(self, text: str, fraction: float, can_stop: bool = False) -> None:
        """Any other long engine task (e.g. re-reading a conversation)."""
        self._hide_timer.stop()
        self.details_button.hide()
        self.stop_button.setVisible(can_stop)
        self.bar.show()
        self.bar.setValue(round(100 * fraction))
        self.label.setText(text)
        self.show()

    def show_note(self, text: str, ms: int = 2 * SHOW_DONE_MS, details: str = "") -> None:
        """A sentence for a while; ``details`` behind a Details button (shown, the note stays)."""
        self.stop_button.hide()
        self.bar.hide()
        self.label.setText(text)
        self._details = details
        self.details_button.setVisible(bool(details))
        self.show()
        self._hide_timer.start(ms)

    def _show_details(self) -> None:
        self._hide_timer.stop()
        self.details_button.hide()
        self.label.setText(f"{self.label.text()}\n{self._details}")

    def close_task(self) -> None:
        self.stop_button.hide()
        self.details_button.hide()
        self.hide()

    def on_event(self, event: StepEvent) -> None:
        self.stop_button.hide()
        self.details_button.hide()
        self.bar.show()
        percent = round(100 * event.fraction)
        if event.stage is StepStage.END:
            self.bar.setValue(100)
            self.label.setText(compacted_text(event))
            self._hide_timer.start(SHOW_DONE_MS)
        else:
            self._hide_timer.stop()
            self.bar.setValue(percent)
            self.label.setText(f"Compacting context memory to {event.target.words}… {percent}%")
        self.show()
