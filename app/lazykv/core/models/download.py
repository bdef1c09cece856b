"""Downloading a Hub model into the Hugging Face cache, in a worker process so that Cancel stops it.

``hf_hub_download`` has no cancel hook, so it runs in its own (spawned) process; its ``tqdm_class`` reports
the bytes, and the parent turns them into speed and time left. A cancelled or interrupted download leaves
huggingface_hub's ``.incomplete`` file, which the next download of the same file resumes (with Xet off in
the worker: the plain HTTP path is the one that resumes). Before it starts: the free disk space is checked.
After: each file's sha256 is checked against the Hub's LFS metadata, and wrong bytes are removed, never
offered. The files land in the Hugging Face cache, where other tools find them too.
"""

from __future__ import annotations

import errno
import hashlib
import multiprocessing
import os
import queue
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lazykv.core.models.hub import Hub, HubError, HubModel, explain, find_model
from lazykv.core.models.scan import Places

DISK_MARGIN = 256 * 1024 * 1024  # left free beside the model
REPORT_EVERY_S = 0.1
SPEED_WINDOW_S = 5.0
RETRIES = 3  # a dropped connection is taken up again this many times


@dataclass(frozen=True)
class Job:
    repo_id: str
    filename: str  # the model's (first) file
    cache_dir: Path
    hub: Hub


Report = Callable[[tuple[Any, ...]], None]


def fetch(job: Job, report: Report = lambda event: None) -> Path:
    """Download the model (every shard) into the cache and check it; its (first) file's path in the cache.

    ``report`` gets ("size", total bytes, bytes already there) once, then ("bytes", bytes so far) as they
    arrive. Raises HubError."""
    job.hub.require_online()
    model = find_model(job.repo_id, job.filename, job.hub)
    if model.problem:
        raise HubError(f"{model.name} is {model.problem}.", kind="other")
    missing = [f.name for f in model.files if not f.sha256]
    if missing:
        raise HubError(f"The Hub gives no sha256 for {missing[0]}, so its bytes cannot be checked; it is not "
                       "downloaded.", kind="other")
    have = _bytes_present(job.cache_dir, model)
    report(("size", model.size, have))
    check_disk(job.cache_dir, model.size - have)
    paths = []
    done = 0
    for f in model.files:
        paths.append(_download_file(job, f.name, f.sha256, lambda n, base=done: report(("bytes", base + n))))
        done += f.size
    report(("bytes", model.size))
    return paths[0]


def _download_file(job: Job, name: str, sha256: str, progress: Callable[[int], None]) -> Path:
    """One file through hf_hub_download; a connection dropped mid-transfer is taken up again where it
    stopped (huggingface_hub keeps the partial file and asks for the rest), up to RETRIES times."""
    import httpx
    from huggingface_hub import hf_hub_download

    bar = _progress_class(progress)
    for attempt in range(RETRIES + 1):
        try:
            path = Path(hf_hub_download(job.repo_id, name, cache_dir=job.cache_dir, endpoint=job.hub.endpoint,
                                        token=job.hub.token, tqdm_class=bar))
            break
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout) as err:
            if attempt == RETRIES:
                raise HubError(f"The connection dropped while {name} was downloading; download it again to "
                               "go on where it stopped.", repr(err), "interrupted") from err
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise HubError(f"The disk is full: {name} could not be written to {job.cache_dir}. Free some "
                               "space and download it again; it goes on where it stopped.", repr(err),
                               "disk") from err
            raise explain(err, job.hub, job.repo_id, name) from err
        except Exception as err:
            raise explain(err, job.hub, job.repo_id, name) from err
    actual = _sha256(path)
    if actual != sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise HubError(f"{name} arrived with other bytes than the Hub lists (sha256 mismatch); it was "
                       "removed. Download it again.",
                       f"sha256 {actual}, the Hub's LFS metadata says {sha256}", "wrong_bytes")
    return path


def check_disk(cache_dir: Path, needed: int) -> None:
    """Refuse (HubError "disk") when the cache's disk has not ``needed`` bytes free plus a margin."""
    folder = cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed + DISK_MARGIN > free:
        from lazykv.core.engine.memory import fmt_bytes

        raise HubError(f"Not enough free disk space: the download needs {fmt_bytes(needed)} (and "
                       f"{fmt_bytes(DISK_MARGIN)} to spare), {cache_dir} has {fmt_bytes(free)} free.",
                       f"needed {needed} + margin {DISK_MARGIN}, free {free} at {folder}", "disk")


def _bytes_present(cache_dir: Path, model: HubModel) -> int:
    """Bytes of the model already in the cache: whole blobs and the partial downloads resumed from."""
    from huggingface_hub.file_download import repo_folder_name

    blobs = cache_dir / repo_folder_name(repo_id=model.repo_id, repo_type="model") / "blobs"
    total = 0
    for f in model.files:
        for candidate in (blobs / f.sha256, blobs / f"{f.sha256}.incomplete"):
            if candidate.is_file():
                total += min(candidate.stat().st_size, f.size)
                break
    return total


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _progress_class(progress: Callable[[int], None]) -> type:
    """A tqdm class for ``hf_hub_download`` that prints nothing and hands its count to ``progress``."""
    from tqdm import tqdm

    class Progress(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs.update(disable=False, file=_Nowhere())
            super().__init__(*args, **kwargs)
            self._last = 0.0
            progress(int(self.n))

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            now = time.monotonic()
            if now - self._last >= REPORT_EVERY_S or (self.total and self.n >= self.total):
                self._last = now
                progress(int(self.n))
            return shown

    return Progress


class _Nowhere:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


def _worker(job: Job, events: Any) -> None:
    """The worker process: ("done", path) or ("failed", message, details, kind) at the end."""
    os.environ["HF_HUB_DISABLE_XET"] = "1"  # read at import: the plain HTTP download resumes across runs
    try:
        path = fetch(job, events.put)
    except HubError as err:
        events.put(("failed", str(err), err.details, err.kind))
    except Exception as err:  # anything else still ends the download with a sentence
        events.put(("failed", f"The download failed: {err}", repr(err), "other"))
    else:
        events.put(("done", str(path)))


@dataclass
class Progress:
    """Where a download stands, as the parent sees it."""

    total: int = 0
    done: int = 0
    started_at: int = 0  # bytes there when it started (a resumed download)
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, done: int, now: float) -> None:
        self.done = done
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.popleft()

    @property
    def speed(self) -> float:
        """Bytes per second over the last few seconds (0 until two reports)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        speed = self.speed
        return (self.total - self.done) / speed if speed > 0 and self.total else None

    def describe(self) -> str:
        """``1.2 GiB of 4.4 GiB, 21.0 MiB/s, 2 min 35 s left``."""
        from lazykv.core.engine.memory import fmt_bytes

        text = f"{fmt_bytes(self.done)} of {fmt_bytes(self.total)}"
        if self.speed > 0:
            text += f", {fmt_bytes(self.speed)}/s"
        left = self.seconds_left
        if left is not None:
            text += f", {_duration(left)} left"
        return text


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{s} s"


class Download:
    """A download in its worker process. ``poll()`` (from any loop, never blocking) takes the worker's news;
    ``state`` is "running", "done", "failed" or "cancelled"; ``path`` (done) or ``error`` (failed)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.progress = Progress()
        self.state = "running"
        self.path: Path | None = None
        self.error: HubError | None = None
        context = multiprocessing.get_context("spawn")  # never fork a process that runs Qt or the engine
        self._events = context.Queue()
        self._process = context.Process(target=_worker, args=(job, self._events), daemon=True,
                                        name=f"lazykv-download {job.repo_id}")
        self._process.start()

    @property
    def running(self) -> bool:
        return self.state == "running"

    def poll(self) -> bool:
        """Take what the worker said; True when something changed."""
        changed = False
        while self.running:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            changed = True
            self._take(event)
        if self.running and not self._process.is_alive() and self._events.empty():
            self._finish("failed", HubError("The download stopped unexpectedly; start it again to go on.",
                                            f"worker exit code {self._process.exitcode}"))
            changed = True
        return changed

    def _take(self, event: tuple[Any, ...]) -> None:
        now = time.monotonic()
        if event[0] == "size":
            self.progress.total, self.progress.started_at = event[1], event[2]
            self.progress.add(event[2], now)
        elif event[0] == "bytes":
            self.progress.add(max(event[1], self.progress.done), now)
        elif event[0] == "done":
            self.path = Path(event[1])
            self._finish("done")
        elif event[0] == "failed":
            self._finish("failed", HubError(event[1], event[2], event[3]))

    def _finish(self, state: str, error: HubError | None = None) -> None:
        self.state, self.error = state, error
        self._process.join(timeout=5)

    def cancel(self) -> None:
        """Stop the worker now; what arrived stays in the cache's partial file for the next try."""
        if not self.running:
            return
        self._process.terminate()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self.state = "cancelled"

    def wait(self, timeout: float | None = None, step: float = 0.05) -> str:
        """Poll until it ends (or ``timeout`` seconds): for scripts and the terminal."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.running and (end is None or time.monotonic() < end):
            self.poll()
            time.sleep(step)
        return self.state


def start(repo_id: str, filename: str, places: Places | None = None, hub: Hub | None = None) -> Download:
    """A download of ``repo_id``'s model ``filename`` into the Hugging Face cache, started."""
    places = places or Places.current()
    hub = hub or Hub.from_env(places.env)
    hub.require_online()
    return Download(Job(repo_id, filename, places.hf_cache(), hub))
