"""Measures how long the GUI event loop goes without running: the longest gap between 10 ms ticks."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Qt, QTimer

TICK_MS = 10


class StallMeter(QObject):
    """``start()``, do things, ``stop()``; ``max_gap_ms`` is the longest time between two ticks.

    A responsive loop gives ~TICK_MS; anything the GUI thread blocks on shows up as a gap.
    ``cpu_gaps_ms`` are the same intervals in the GUI thread's own CPU time: what it computed
    between two ticks, without the time it waited for a core or the GIL (on a busy machine a
    wall-clock gap can be long while the GUI thread itself did little).
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._timer = QTimer(self)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self._tick)
        self._last = 0.0
        self._last_cpu = 0.0
        self.gaps_ms: list[float] = []
        self.cpu_gaps_ms: list[float] = []

    def start(self) -> None:
        self.gaps_ms.clear()
        self.cpu_gaps_ms.clear()
        self._last = time.perf_counter()
        self._last_cpu = time.thread_time()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()
        self._tick()

    @property
    def max_gap_ms(self) -> float:
        return max(self.gaps_ms, default=0.0)

    @property
    def max_cpu_gap_ms(self) -> float:
        return max(self.cpu_gaps_ms, default=0.0)

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.gaps_ms.append(1000 * (now - self._last))
        self.cpu_gaps_ms.append(1000 * (cpu - self._last_cpu))
        self._last, self._last_cpu = now, cpu
