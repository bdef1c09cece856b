"""The GGUF models other tools have left on disk, found where each tool keeps them; nothing is copied.

One small scanner per tool, each yielding the files it found (``Found``); ``scan`` groups the shards of
split models, reads each header once and returns one ``ModelRecord`` per model. A damaged or foreign file
gets its record with a reason, and the scan goes on.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lazykv.core.models.record import ModelRecord, record_for, split_info

MAX_DEPTH = 6  # folders below a scanned root (LM Studio: publisher/repo/file)


@dataclass(frozen=True)
class Places:
    """Where to look: a home folder, the environment, and the folders the user added."""

    home: Path
    env: Mapping[str, str] = field(default_factory=dict)
    folders: tuple[Path, ...] = ()

    @classmethod
    def current(cls, folders: Iterable[Path | str] = ()) -> Places:
        return cls(Path.home(), dict(os.environ), tuple(Path(f).expanduser() for f in folders))

    def _cache_home(self) -> Path:
        return Path(self.env.get("XDG_CACHE_HOME") or self.home / ".cache")

    def hf_cache(self) -> Path:
        """The Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
        if self.env.get("HF_HUB_CACHE"):
            return Path(self.env["HF_HUB_CACHE"]).expanduser()
        hf_home = self.env.get("HF_HOME") or self._cache_home() / "huggingface"
        return Path(hf_home).expanduser() / "hub"

    def lm_studio(self) -> list[Path]:
        return [self.home / ".lmstudio" / "models", self._cache_home() / "lm-studio" / "models"]

    def gpt4all(self) -> list[Path]:
        if sys.platform == "darwin":
            return [self.home / "Library" / "Application Support" / "nomic.ai" / "GPT4All"]
        if sys.platform == "win32":
            local = Path(self.env.get("LOCALAPPDATA") or self.home / "AppData" / "Local")
            return [local / "nomic.ai" / "GPT4All"]
        data = Path(self.env.get("XDG_DATA_HOME") or self.home / ".local" / "share")
        return [data / "nomic.ai" / "GPT4All"]

    def ollama(self) -> Path:
        return Path(self.env.get("OLLAMA_MODELS") or self.home / ".ollama" / "models")

    def lazykv(self) -> Path:
        """The folder `make models` fills (model_fetch.models_dir's rule, under this home)."""
        return self._cache_home() / "lazykv" / "models"

    def llama_cpp(self) -> Path:
        if self.env.get("LLAMA_CACHE"):
            return Path(self.env["LLAMA_CACHE"]).expanduser()
        if sys.platform == "darwin":
            return self.home / "Library" / "Caches" / "llama.cpp"
        return self._cache_home() / "llama.cpp"


@dataclass(frozen=True)
class Found:
    """A file a scanner found. ``named``: its file name is the model's (Ollama's blobs are named by hash)."""

    path: Path
    source: str
    label: str
    named: bool = True


@dataclass(frozen=True)
class ScanResult:
    records: tuple[ModelRecord, ...]
    notes: tuple[str, ...]  # places that could not be read, in words

    @property
    def usable(self) -> list[ModelRecord]:
        return [r for r in self.records if r.usable]


HF_SOURCE, LM_STUDIO, GPT4ALL, OLLAMA, LLAMA_CPP, LAZYKV, FOLDER = (
    "Hugging Face cache", "LM Studio", "GPT4All", "Ollama", "llama.cpp cache", "LazyKV's models", "folder")


def scan_hf_cache(places: Places) -> Iterator[Found]:
    """The Hugging Face cache through huggingface_hub's own reader; every revision's GGUF files."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        info = scan_cache_dir(places.hf_cache())  # a repo it cannot read is a warning there, not an error
    except CacheNotFound:
        return
    except CorruptedCacheException as err:
        raise ValueError(f"the Hugging Face cache at {places.hf_cache()} is not one: {err}") from err
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for file in sorted(revision.files, key=lambda f: f.file_name):
                if file.file_name.lower().endswith(".gguf"):
                    yield Found(file.file_path, HF_SOURCE, f"{repo.repo_id}/{file.file_name}")


def scan_lm_studio(places: Places) -> Iterator[Found]:
    for root in places.lm_studio():
        yield from _gguf_files(root, LM_STUDIO)


def scan_gpt4all(places: Places) -> Iterator[Found]:
    for root in places.gpt4all():
        yield from _gguf_files(root, GPT4ALL, depth=0)


def scan_llama_cpp(places: Places) -> Iterator[Found]:
    yield from _gguf_files(places.llama_cpp(), LLAMA_CPP)


def scan_lazykv(places: Places) -> Iterator[Found]:
    """The demo and test models `make models` fetched."""
    yield from _gguf_files(places.lazykv(), LAZYKV, depth=0)


def scan_folders(places: Places) -> Iterator[Found]:
    for root in places.folders:
        yield from _gguf_files(root, FOLDER)


OLLAMA_MODEL = "application/vnd.ollama.image.model"


def scan_ollama(places: Places) -> Iterator[Found]:
    """Ollama's manifests (manifests/<registry>/<namespace>/<name>/<tag>, JSON) name the model's GGUF blob
    (blobs/sha256-<hex>); projector layers are other media types and are left out."""
    root = places.ollama()
    manifests = root / "manifests"
    for path in sorted(_walk(manifests, MAX_DEPTH)):
        try:
            layers = json.loads(path.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        parts = path.relative_to(manifests).parts
        name = f"{parts[-2]}:{parts[-1]}" if parts[-3:-2] == ("library",) else "/".join(parts[1:-1]) + \
            f":{parts[-1]}"
        for layer in layers if isinstance(layers, list) else []:
            digest = layer.get("digest", "") if isinstance(layer, dict) else ""
            if layer.get("mediaType") == OLLAMA_MODEL and digest.startswith("sha256:"):
                yield Found(root / "blobs" / digest.replace(":", "-"), OLLAMA, name, named=False)


SCANNERS: dict[Callable[[Places], Iterable[Found]], str] = {  # each scanner and where it looks, in words
    scan_hf_cache: HF_SOURCE, scan_lm_studio: LM_STUDIO, scan_gpt4all: GPT4ALL, scan_ollama: OLLAMA,
    scan_llama_cpp: LLAMA_CPP, scan_lazykv: LAZYKV, scan_folders: "your folders"}


def scan(places: Places | None = None) -> ScanResult:
    """Every model in every tool's folder, each file once (the first tool that names it wins)."""
    places = places or Places.current()
    found: list[Found] = []
    notes: list[str] = []
    for scanner, where in SCANNERS.items():
        try:
            found.extend(scanner(places))
        except (OSError, ValueError) as err:
            notes.append(f"{where}: cannot be read ({err})")
    return ScanResult(tuple(_records(_unique(found))), tuple(notes))


def _unique(found: Iterable[Found]) -> list[Found]:
    seen: set[Path] = set()
    kept = []
    for f in found:
        try:
            real = f.path.resolve()
        except OSError:
            real = f.path
        if real not in seen:
            seen.add(real)
            kept.append(f)
    return kept


def _records(found: list[Found]) -> Iterator[ModelRecord]:
    """One record per model: a split model's shards join its first shard's record (in shard order)."""
    groups: dict[tuple[Path, str, int], list[Found]] = {}
    for f in found:
        info = split_info(f.path.name) if f.named else None
        if info is None:
            yield record_for([f.path], f.source, f.label, named=f.named)
            continue
        groups.setdefault((f.path.parent, info[0], info[2]), []).append(f)
    for (_, _, count), shards in groups.items():
        shards.sort(key=lambda f: f.path.name)
        first = shards[0]
        label = first.label
        yield record_for([s.path for s in shards], first.source, label, expected=count)


def _gguf_files(root: Path, source: str, depth: int = MAX_DEPTH) -> Iterator[Found]:
    for path in sorted(_walk(root, depth)):
        if path.name.lower().endswith(".gguf"):
            yield Found(path, source, str(path.relative_to(root)))


def _walk(root: Path, depth: int) -> Iterator[Path]:
    """Regular files (or links to them) under ``root``, at most ``depth`` folders down; folder links are
    not followed (no loops), unreadable folders are passed over."""
    if not root.is_dir():
        return
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, followlinks=False):
        if len(Path(folder).parts) - base >= depth:
            dirs.clear()
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            yield Path(folder) / name
