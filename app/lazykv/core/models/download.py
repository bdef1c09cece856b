"""Downloading a Hub model into the Hugging Face cache, in a worker process so that Cancel stops it.

The download runs in its own (spawned) process, so that Cancel can stop it at any byte; the parent turns
the bytes it reports into speed and time left. The bytes are fetched here, not by ``hf_hub_download``:
huggingface_hub 1.18 and later write to a temporary file of their own and delete it when a download fails,
so a cancelled download would start again from nothing. Here the bytes arrive in the cache's
``blobs/<etag>.incomplete`` (the name and lock huggingface_hub 1.17 and earlier use, so they and this app
take a partial file up from each other), and a later download asks only for the rest with an HTTP Range
request. The whole file is checked against the sha256 of the Hub's LFS metadata before it becomes the blob;
wrong bytes are removed, never offered. ``hf_hub_download`` then finds the blob and lays out the snapshot
link and ref as for any download, so other tools find the file too. Before it starts: the free disk space
is checked.
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

from lazykv.core.models.hub import TIMEOUT_S, Hub, HubError, HubFile, HubModel, explain, find_model
from lazykv.core.models.scan import Places

DISK_MARGIN = 256 * 1024 * 1024  # left free beside the model
SPEED_WINDOW_S = 5.0
RETRIES = 3  # a dropped connection is taken up again this many times
CHUNK = 1024 * 1024  # bytes read from the connection at a time: one report of progress each
LOCK_WAIT_S = 30.0  # for another program downloading the same file into the cache (huggingface_hub's lock)


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
        paths.append(_download_file(job, f, lambda n, base=done: report(("bytes", base + n))))
        done += f.size
    report(("bytes", model.size))
    return paths[0]


def _download_file(job: Job, file: HubFile, progress: Callable[[int], None]) -> Path:
    """One file into the cache, its path there (the snapshot's link to the blob).

    The blob's ``.incomplete`` file is taken up where it ends, and a connection dropped mid-transfer is
    taken up again where it stopped, up to RETRIES times."""
    from filelock import Timeout
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    name = file.name
    folder = repo_folder_name(repo_id=job.repo_id, repo_type="model")
    verified: Path | None = None
    try:
        meta = get_hf_file_metadata(hf_hub_url(job.repo_id, name, endpoint=job.hub.endpoint),
                                    token=job.hub.token, endpoint=job.hub.endpoint)
        if not meta.etag or not meta.commit_hash:
            raise HubError(f"The Hub's answer for {name} lacks its commit or ETag, so it cannot be placed in "
                           "the cache; try again later.", f"commit {meta.commit_hash!r}, etag {meta.etag!r}")
        blob = job.cache_dir / folder / "blobs" / meta.etag
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            lock = job.cache_dir / ".locks" / folder / f"{meta.etag}.lock"
            lock.parent.mkdir(parents=True, exist_ok=True)
            with WeakFileLock(lock, timeout=LOCK_WAIT_S):
                if not blob.exists():
                    url = hf_hub_url(job.repo_id, name, revision=meta.commit_hash, endpoint=job.hub.endpoint)
                    headers = build_hf_headers(token=job.hub.token, headers={"Accept-Encoding": "identity"})
                    partial = blob.with_name(blob.name + ".incomplete")
                    _fetch_rest(url, headers, partial, meta.size or file.size, name, progress)
                    _check_sha256(partial, file)
                    os.replace(partial, blob)
                    verified = blob
        # the blob is there: huggingface_hub links it into the snapshot and records the ref
        path = Path(hf_hub_download(job.repo_id, name, cache_dir=job.cache_dir, endpoint=job.hub.endpoint,
                                    token=job.hub.token))
    except HubError:
        raise
    except Timeout as err:
        raise HubError(f"Another program is downloading {name} into the Hugging Face cache; download it "
                       "again when that one has finished.", repr(err), "other") from err
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise HubError(f"The disk is full: {name} could not be written to {job.cache_dir}. Free some "
                           "space and download it again; it goes on where it stopped.", repr(err),
                           "disk") from err
        raise explain(err, job.hub, job.repo_id, name) from err
    except Exception as err:
        raise explain(err, job.hub, job.repo_id, name) from err
    if verified is None or path.resolve() != verified.resolve():
        _check_sha256(path, file)  # a blob that was there already, or one huggingface_hub fetched itself
    return path


def _fetch_rest(url: str, headers: dict[str, str], partial: Path, size: int, name: str,
                progress: Callable[[int], None]) -> None:
    """Append to ``partial`` what it lacks of the file's ``size`` bytes, asked for with an HTTP Range
    request (the whole file when nothing is there); a dropped connection is asked again, up to RETRIES
    times. Through huggingface_hub's own session: its proxies and TLS settings."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    from lazykv.core.models.hub import http_library

    dropped = http_library().TransportError
    for attempt in range(RETRIES + 1):
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:  # longer than the file: not a beginning of it
            partial.unlink()
            have = 0
        progress(have)
        if have == size:
            return
        asked = {**headers, "Range": f"bytes={have}-"} if have else headers
        try:
            with get_session().stream("GET", url, headers=asked, follow_redirects=True,
                                      timeout=TIMEOUT_S) as response:
                hf_raise_for_status(response)
                if have and not _continues_at(response, have):  # the server sent the whole file
                    have = 0
                with partial.open("ab" if have else "wb") as out:
                    for chunk in response.iter_bytes(CHUNK):
                        out.write(chunk)
                        have += len(chunk)
                        progress(have)
        except dropped as err:
            if attempt == RETRIES:
                raise HubError(f"The connection dropped while {name} was downloading; download it again to "
                               "go on where it stopped.", repr(err), "interrupted") from err
            continue
        if have == size:
            return
        if have > size or attempt == RETRIES:
            raise HubError(f"The Hub sent {name} with another length than it lists; download it again.",
                           f"{have} bytes, the Hub lists {size}", "interrupted")


def _continues_at(response: Any, offset: int) -> bool:
    """Whether ``response`` is the file's bytes from ``offset`` on (a 206 with that Content-Range)."""
    if response.status_code != 206:
        return False
    first = response.headers.get("Content-Range", "").removeprefix("bytes ").partition("-")[0]
    return first.strip() == str(offset)


def _check_sha256(path: Path, file: HubFile) -> None:
    """Remove ``path`` (and the blob it links to) unless its bytes have the Hub's sha256 (HubError)."""
    actual = _sha256(path)
    if actual != file.sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise HubError(f"{file.name} arrived with other bytes than the Hub lists (sha256 mismatch); it was "
                       "removed. Download it again.",
                       f"sha256 {actual}, the Hub's LFS metadata says {file.sha256}", "wrong_bytes")


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


def _worker(job: Job, events: Any) -> None:
    """The worker process: ("done", path) or ("failed", message, details, kind) at the end."""
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
