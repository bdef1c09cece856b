"""Downloads into the Hugging Face cache from the fake Hub: progress, Cancel and resume in a worker process,
an interrupted transfer resumed, wrong bytes refused, and each failure as a sentence.

test_hub_versions.py runs this file again on the oldest huggingface_hub pyproject.toml allows and on the
newest release."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import pytest

from lazykv.core.models import download
from lazykv.core.models.download import DISK_MARGIN, Job, Progress, fetch
from lazykv.core.models.hub import Hub, HubError
from lazykv.core.models.scan import Places, scan
from tests.support.fake_hub import FakeHub

MiB = 1024 * 1024


def _job(places: Places, hub: Hub, repo: str, name: str) -> Job:
    return Job(repo, name, places.hf_cache(), hub)


def _incomplete(places: Places) -> list[Path]:
    return sorted(places.hf_cache().rglob("*.incomplete"))


def test_a_download_lands_in_the_hf_cache_checked_and_the_scan_finds_it(places: Places, hub: Hub,
                                                                       fake_hub: FakeHub) -> None:
    events: list[tuple] = []
    path = fetch(_job(places, hub, "acme/Tiny-GGUF", "tiny-Q8_0.gguf"), events.append)
    data = fake_hub.repos["acme/Tiny-GGUF"].files["tiny-Q8_0.gguf"]
    assert path.read_bytes() == data
    assert path.is_symlink() and path.resolve().name == hashlib.sha256(data).hexdigest()  # the cache's layout
    assert events[0] == ("size", len(data), 0) and events[-1] == ("bytes", len(data))
    (record,) = scan(places).records
    assert record.path == path and record.usable and record.label == "acme/Tiny-GGUF/tiny-Q8_0.gguf"


def test_a_split_model_downloads_every_shard(places: Places, hub: Hub, fake_hub: FakeHub) -> None:
    shards = fake_hub.repos["acme/Split-GGUF"].files
    path = fetch(_job(places, hub, "acme/Split-GGUF", min(shards)))
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(shards)
    (record,) = scan(places).records
    assert record.path == path and len(record.shards) == 3 and record.usable


def test_an_interrupted_transfer_resumes_where_it_stopped(places: Places, hub: Hub,
                                                          fake_hub: FakeHub) -> None:
    name = "big-Q8_0.gguf"
    fake_hub.cut_after[name] = 10 * MiB + 12345  # the connection drops there, once
    path = fetch(_job(places, hub, "acme/Big-GGUF", name))
    assert path.read_bytes() == fake_hub.repos["acme/Big-GGUF"].files[name]
    ranges = fake_hub.downloads_of(name)
    assert ranges[0] == "" and len(ranges) == 2 and ranges[1].startswith("bytes=")
    assert int(ranges[1][6:].rstrip("-")) >= 10 * MiB  # not from the start


def test_a_partial_file_is_taken_up_with_a_range_request(places: Places, hub: Hub,
                                                         fake_hub: FakeHub) -> None:
    """What an earlier download left in the blob's .incomplete file (this app's, or huggingface_hub 1.17's
    at the same name) is kept; only the rest is asked for. huggingface_hub 1.18 and later, left to
    themselves, download into a file of their own and ask for everything."""
    name = "big-Q8_0.gguf"
    data = fake_hub.repos["acme/Big-GGUF"].files[name]
    sha = hashlib.sha256(data).hexdigest()
    blobs = places.hf_cache() / "models--acme--Big-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").write_bytes(data[: 7 * MiB + 3])
    events: list[tuple] = []
    path = fetch(_job(places, hub, "acme/Big-GGUF", name), events.append)
    assert path.read_bytes() == data and path.resolve() == blobs / sha
    assert fake_hub.downloads_of(name) == [f"bytes={7 * MiB + 3}-"]
    assert events[0] == ("size", len(data), 7 * MiB + 3) and events[-1] == ("bytes", len(data))
    assert _incomplete(places) == []


def test_a_server_that_ignores_the_range_gets_the_whole_file_written_anew(places: Places, hub: Hub,
                                                                          fake_hub: FakeHub) -> None:
    name = "big-Q8_0.gguf"
    data = fake_hub.repos["acme/Big-GGUF"].files[name]
    sha = hashlib.sha256(data).hexdigest()
    blobs = places.hf_cache() / "models--acme--Big-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").write_bytes(data[: 3 * MiB])
    fake_hub.ignore_range.add(name)  # answers 200 with every byte
    path = fetch(_job(places, hub, "acme/Big-GGUF", name))
    assert path.read_bytes() == data  # not the first 3 MiB twice
    assert fake_hub.downloads_of(name) == [f"bytes={3 * MiB}-"]


def test_a_file_another_program_is_downloading_is_left_to_it(places: Places, hub: Hub, fake_hub: FakeHub,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's lock on the blob, as its own downloads take it: held, nothing is written."""
    from huggingface_hub.utils import WeakFileLock

    sha = hashlib.sha256(fake_hub.repos["acme/Tiny-GGUF"].files["tiny-Q8_0.gguf"]).hexdigest()
    lock = places.hf_cache() / ".locks" / "models--acme--Tiny-GGUF" / f"{sha}.lock"
    lock.parent.mkdir(parents=True)
    monkeypatch.setattr(download, "LOCK_WAIT_S", 0.3)
    with WeakFileLock(lock), pytest.raises(HubError) as err:
        fetch(_job(places, hub, "acme/Tiny-GGUF", "tiny-Q8_0.gguf"))
    assert "Another program is downloading tiny-Q8_0.gguf" in str(err.value)
    assert fake_hub.downloads_of("tiny-Q8_0.gguf") == [] and _incomplete(places) == []


def test_wrong_bytes_are_refused_and_removed(places: Places, hub: Hub) -> None:
    with pytest.raises(HubError) as err:
        fetch(_job(places, hub, "acme/Liar-GGUF", "liar-Q8_0.gguf"))
    assert err.value.kind == "wrong_bytes" and "sha256" in str(err.value)
    assert [p for p in places.hf_cache().rglob("*") if p.is_file() and p.suffix in ("", ".gguf")
            and "blobs" in p.parts] == []
    assert scan(places).records == ()  # nothing offered


@pytest.mark.parametrize(("repo", "name", "kind", "words"), [
    ("acme/Tiny-GGUF", "no-such-Q8_0.gguf", "no_file", "has no file no-such-Q8_0.gguf"),
    ("acme/No-Such-GGUF", "x.gguf", "not_found", "was not found"),
    ("acme/Gated-GGUF", "gated-Q8_0.gguf", "gated", "accept its conditions"),
])
def test_failures_are_sentences(places: Places, hub: Hub, repo: str, name: str, kind: str,
                                words: str) -> None:
    with pytest.raises(HubError) as err:
        fetch(_job(places, hub, repo, name))
    assert err.value.kind == kind and words in str(err.value)
    assert scan(places).records == ()


def test_a_gated_repo_with_a_token_not_granted_is_refused_403_and_with_a_granted_one_downloads(
        places: Places, hub: Hub, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    # model_info of a gated repo is public; the file is not: 403 for a token without access
    with pytest.raises(HubError) as err:
        fetch(_job(places, Hub(hub.endpoint, token="hf_other"), "acme/Gated-GGUF", "gated-Q8_0.gguf"))
    assert err.value.kind == "gated" and "403" in err.value.details
    path = fetch(_job(places, Hub(hub.endpoint, token="hf_granted"), "acme/Gated-GGUF", "gated-Q8_0.gguf"))
    assert path.exists()


def test_a_private_repo_with_a_refused_token_is_a_401_sentence(places: Places, hub: Hub) -> None:
    with pytest.raises(HubError) as err:
        fetch(_job(places, Hub(hub.endpoint, token="hf_wrong"), "acme/Private-GGUF", "private-Q8_0.gguf"))
    assert err.value.kind == "unauthorized" and "HF_TOKEN" in str(err.value)


def test_not_enough_disk_space_is_said_before_anything_is_downloaded(
        places: Places, hub: Hub, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage

    def small_disk(path: str | Path):  # type: ignore[no-untyped-def]
        usage = real(path)
        return usage._replace(free=DISK_MARGIN + 1000)

    monkeypatch.setattr(download.shutil, "disk_usage", small_disk)
    fake_hub.requests.clear()
    with pytest.raises(HubError) as err:
        fetch(_job(places, hub, "acme/Big-GGUF", "big-Q8_0.gguf"))
    assert err.value.kind == "disk" and "Not enough free disk space" in str(err.value)
    assert fake_hub.downloads_of("big-Q8_0.gguf") == []


def test_a_full_disk_during_the_download_is_said(places: Places, hub: Hub,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    real_open = Path.open

    def full(self: Path, mode: str = "r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.name.endswith(".incomplete") and mode in ("ab", "wb"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(HubError) as err:
        fetch(_job(places, hub, "acme/Tiny-GGUF", "tiny-Q8_0.gguf"))
    assert err.value.kind == "disk" and "The disk is full" in str(err.value)


def test_offline_mode_starts_nothing(places: Places, hub_env: dict[str, str]) -> None:
    with pytest.raises(HubError) as err:
        download.start("acme/Tiny-GGUF", "tiny-Q8_0.gguf", places,
                       Hub.from_env({**hub_env, "HF_HUB_OFFLINE": "1"}))
    assert err.value.kind == "offline"


def test_progress_says_bytes_speed_and_time_left() -> None:
    p = Progress(total=100 * MiB)
    p.add(0, 10.0)
    p.add(20 * MiB, 12.0)
    assert p.speed == 10 * MiB
    assert p.seconds_left == 8.0
    assert p.describe() == "20.0 MiB of 100.0 MiB, 10.0 MiB/s, 8 s left"


@pytest.mark.slow
def test_cancel_stops_the_worker_and_the_next_download_resumes(places: Places, hub: Hub,
                                                               fake_hub: FakeHub) -> None:
    """In a worker process: progress arrives, Cancel kills it mid-file, nothing is offered; the next
    download (a restart) asks only for the rest, and its file is whole and checked."""
    name = "big-Q8_0.gguf"
    data = fake_hub.repos["acme/Big-GGUF"].files[name]
    fake_hub.hold_after[name] = 10 * MiB + 1
    job = download.start("acme/Big-GGUF", name, places, hub)
    deadline = time.monotonic() + 60
    while job.progress.done < 10 * MiB and job.running and time.monotonic() < deadline:
        job.poll()
        time.sleep(0.02)
    assert job.running and job.progress.total == len(data) and job.progress.done >= 10 * MiB
    job.cancel()
    assert job.state == "cancelled"
    assert len(_incomplete(places)) == 1
    assert scan(places).records == ()  # the partial file is never offered
    fake_hub.release()
    again = download.start("acme/Big-GGUF", name, places, hub)
    assert again.wait(timeout=60) == "done", again.error and again.error.details
    kept = again.progress.started_at  # what reached the disk before the kill (at most what arrived)
    assert 0 < kept <= 10 * MiB + 1
    assert again.path is not None and again.path.read_bytes() == data
    assert fake_hub.downloads_of(name)[-1] == f"bytes={kept}-"  # only the rest was asked for
    assert _incomplete(places) == []


@pytest.mark.slow
def test_a_failure_in_the_worker_comes_back_as_the_sentence(places: Places, hub: Hub) -> None:
    job = download.start("acme/Tiny-GGUF", "no-such-Q8_0.gguf", places, hub)
    assert job.wait(timeout=60) == "failed"
    assert job.error is not None and job.error.kind == "no_file"

