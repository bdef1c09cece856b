"""Resident memory of this process, sampled from /proc, and a memcpy reference speed."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Samples RSS from a background thread every `interval` seconds while in the `with` block.

    The arrays are preallocated so that sampling itself does not grow the process.
    """

    def __init__(self, interval: float, capacity: int = 100_000) -> None:
        self.interval = interval
        self.times = np.zeros(capacity)
        self.values = np.zeros(capacity, dtype=np.int64)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            while not self._stop.is_set() and self.count < len(self.times):
                os.lseek(fd, 0, os.SEEK_SET)
                self.values[self.count] = int(os.read(fd, 128).split()[1]) * PAGE_SIZE
                self.times[self.count] = time.perf_counter()
                self.count += 1
                time.sleep(self.interval)
        finally:
            os.close(fd)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_between(self, start: float, end: float) -> int:
        """Highest sample taken in [start, end] (0 if none)."""
        times, values = self.times[: self.count], self.values[: self.count]
        inside = (times >= start) & (times <= end)
        return int(values[inside].max()) if inside.any() else 0

    def trace(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        """(seconds since start, RSS) of the samples in [start, end]."""
        times, values = self.times[: self.count], self.values[: self.count]
        inside = (times >= start) & (times <= end)
        return times[inside] - start, values[inside]


def memcpy_seconds(n_bytes: int, reps: int, threads: int = 1) -> float:
    """Best time of copying n_bytes into a preallocated, already touched buffer (numpy copyto), split in
    ``threads`` contiguous parts copied at once (copyto releases the GIL): the baseline of a conversion
    that runs on as many threads."""
    from concurrent.futures import ThreadPoolExecutor

    src = np.ones(n_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    bounds = [n_bytes * i // threads for i in range(threads + 1)]
    parts = [(dst[a:b], src[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    best = float("inf")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in range(reps):
            started = time.perf_counter()
            for done in [pool.submit(np.copyto, d, s) for d, s in parts]:
                done.result()
            best = min(best, time.perf_counter() - started)
    return best
