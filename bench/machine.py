"""What the report says about the machine and the software it ran on."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
CONTENTION_CORES = 0.2  # CPU used by other processes above which a timing is called contended
RETRIES = 4  # tries of a contended timing


@dataclass(frozen=True)
class Machine:
    date: str
    cpu_model: str
    n_cpus: int
    mem_total_gb: float
    os: str
    python: str
    numpy: str
    engine: str
    git: str


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return float("nan")


def git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def describe() -> Machine:
    return Machine(
        date=datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        cpu_model=cpu_model(),
        n_cpus=os.cpu_count() or 0,
        mem_total_gb=mem_total_gb(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        numpy=np.__version__,
        engine=f"llama_cpp {llama_cpp.__version__}",
        git=git_revision(),
    )


def _busy_seconds() -> tuple[float, float]:
    """(CPU seconds busy on the whole machine, CPU seconds used by this process and the children it has waited
    for, such as llama-perplexity) so far."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system
    return (user + nice + system + irq + softirq + steal) / ticks, mine


class OtherLoad:
    """CPU used by other processes (in cores, averaged) between start() and cores()."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._t = time.perf_counter()
        self._busy, self._own = _busy_seconds()

    def cores(self) -> float:
        busy, own = _busy_seconds()
        elapsed = time.perf_counter() - self._t
        return max((busy - self._busy) - (own - self._own), 0.0) / elapsed if elapsed > 0 else 0.0


class WaitBudget:
    """Seconds the whole run may still spend waiting for other processes to go quiet."""

    def __init__(self, seconds: float) -> None:
        self.remaining = seconds
        self.spent = 0.0

    def spend(self, seconds: float) -> None:
        self.spent += seconds
        self.remaining = max(self.remaining - seconds, 0.0)


WAIT_BUDGET = WaitBudget(600.0)  # set from --wait-idle


def wait_for_quiet(
    max_wait_s: float, threshold_cores: float = CONTENTION_CORES, interval_s: float = 3.0
) -> float:
    """Wait (at most max_wait_s and what is left of WAIT_BUDGET) until other processes use less than
    threshold_cores; returns the seconds waited."""
    limit = min(max_wait_s, WAIT_BUDGET.remaining)
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        probe = OtherLoad()
        time.sleep(interval_s)
        if probe.cores() < threshold_cores:
            break
    waited = time.perf_counter() - started
    WAIT_BUDGET.spend(waited)
    return waited


def run_uncontended(
    fn: Callable[[], T],
    prepare: Callable[[], object] | None = None,
    tries: int = RETRIES,
    threshold_cores: float = CONTENTION_CORES,
    max_wait_s: float = 120.0,
) -> tuple[T, int, bool]:
    """Run fn (after prepare, untimed); while other processes used more than threshold_cores during fn,
    wait for quiet and run both again, up to `tries` times or until the wait budget is spent.
    Returns (fn's value, retries, still contended)."""
    attempt = 0
    while True:
        if prepare is not None:
            prepare()
        probe = OtherLoad()
        value = fn()
        if probe.cores() < threshold_cores:
            return value, attempt, False
        if attempt + 1 >= tries or WAIT_BUDGET.remaining <= 0:
            return value, attempt, True
        wait_for_quiet(max_wait_s, threshold_cores, interval_s=1.0)
        attempt += 1
