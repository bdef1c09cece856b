"""The Hugging Face Hub through ``huggingface_hub``: GGUF repos found by a search, a repo's model files with
the sizes, quantizations and sha256 the Hub reports, and a file's GGUF header read with HTTP range requests
(so that the memory plan has the real hyper-parameters before anything is downloaded).

``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are read when a call is made (huggingface_hub reads
some of them once, at import). Every failure is a ``HubError``: one sentence for the user, details apart.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import ModuleType
from typing import Any

from lazykv.core.engine.model_meta import ModelMeta, read_model_meta_from
from lazykv.core.engine.shards import split_info
from lazykv.core.models.record import NOT_A_CHAT_MODEL, is_projector_name, quant_of

DEFAULT_ENDPOINT = "https://huggingface.co"
HEADER_BLOCK = 2 * 1024 * 1024  # bytes per range request
MAX_HEADER = 96 * 1024 * 1024  # a GGUF header longer than this is not read over the network
TIMEOUT_S = 20.0


class HubError(Exception):
    """``str(err)`` is one sentence for the user; ``details`` what exactly happened. ``kind``: "offline",
    "unreachable", "not_found", "no_file", "gated", "unauthorized", "forbidden", "disk", "wrong_bytes",
    "other"."""

    def __init__(self, message: str, details: str = "", kind: str = "other") -> None:
        super().__init__(message)
        self.details = details or message
        self.kind = kind


@dataclass(frozen=True)
class Hub:
    """The Hub as the environment names it."""

    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None  # None: huggingface_hub's own (HF_TOKEN, else the stored login)
    offline: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Hub:
        env = os.environ if env is None else env
        offline = env.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        return cls((env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"), env.get("HF_TOKEN") or None,
                   offline)

    def repo_url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    def api(self) -> Any:
        self.require_online()
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token)

    def require_online(self) -> None:
        if self.offline:
            raise HubError("Offline mode is on (HF_HUB_OFFLINE is set): the Hub is not asked. Unset "
                           "HF_HUB_OFFLINE to search and download.", kind="offline")


@dataclass(frozen=True)
class HubRepo:
    """A model repo a search found."""

    repo_id: str
    downloads: int = 0
    likes: int = 0
    gated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "downloads": self.downloads, "likes": self.likes,
                "gated": self.gated}


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    sha256: str  # of its LFS object, as the Hub reports it ("" when it reports none)


@dataclass(frozen=True)
class HubModel:
    """One model in a repo: a GGUF file, or all shards of a split one."""

    repo_id: str
    files: tuple[HubFile, ...]
    problem: str = ""  # why it is not offered as a chat model ("" when it is)

    @property
    def name(self) -> str:
        return self.files[0].name

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def quant(self) -> str:
        return quant_of(PurePosixPath(self.name).name)

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "file": self.name, "files": [f.name for f in self.files],
                "size": self.size, "quant": self.quant, "problem": self.problem}


def search(query: str, limit: int = 40, hub: Hub | None = None) -> list[HubRepo]:
    """GGUF model repos matching ``query``, most downloaded first: one request to the Hub's /api/models (what
    ``HfApi.list_models`` asks, without its retries: from huggingface_hub 2.0 on, a search without a network
    waited 23 s for them before it said so)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    hub = hub or Hub.from_env()
    hub.require_online()
    params: dict[str, Any] = {"filter": "gguf", "sort": "downloads", "limit": limit}
    if query:
        params["search"] = query
    with _explained(hub):
        response = get_session().get(f"{hub.endpoint}/api/models", params=params,
                                     headers=build_hf_headers(token=hub.token), timeout=TIMEOUT_S)
        hf_raise_for_status(response)
        return [HubRepo(m["id"], m.get("downloads") or 0, m.get("likes") or 0, bool(m.get("gated")))
                for m in response.json()[:limit]]


def repo_models(repo_id: str, hub: Hub | None = None) -> list[HubModel]:
    """A repo's GGUF models with the sizes and sha256 the Hub reports; projectors come last, with a reason."""
    hub = hub or Hub.from_env()
    api = hub.api()
    with _explained(hub, repo_id):
        info = api.model_info(repo_id, files_metadata=True)
    files = []
    for sibling in info.siblings or []:
        if sibling.rfilename.lower().endswith(".gguf"):
            lfs = sibling.lfs
            size = sibling.size if sibling.size is not None else (lfs.size if lfs else 0)
            files.append(HubFile(sibling.rfilename, int(size or 0), lfs.sha256 if lfs else ""))
    return sorted(_group(repo_id, files), key=lambda m: (bool(m.problem), m.name))


def _group(repo_id: str, files: list[HubFile]) -> list[HubModel]:
    models: list[HubModel] = []
    splits: dict[tuple[str, int], list[HubFile]] = {}
    for f in sorted(files, key=lambda f: f.name):
        info = split_info(PurePosixPath(f.name).name)
        if info is None:
            problem = NOT_A_CHAT_MODEL if is_projector_name(f.name) else ""
            models.append(HubModel(repo_id, (f,), problem))
        else:
            splits.setdefault((f.name[: -len("-00001-of-00001.gguf")], info[2]), []).append(f)
    for (_, count), shards in splits.items():
        problem = "" if len(shards) == count else f"a split model with {len(shards)} of its {count} shards"
        if is_projector_name(shards[0].name):
            problem = NOT_A_CHAT_MODEL
        models.append(HubModel(repo_id, tuple(shards), problem))
    return models


def find_model(repo_id: str, filename: str, hub: Hub | None = None) -> HubModel:
    """The model of ``repo_id`` whose (first) file is ``filename``."""
    for model in repo_models(repo_id, hub):
        if filename in (f.name for f in model.files):
            return model
    raise HubError(f"{repo_id} has no file {filename}.", kind="no_file")


def read_header(model: HubModel, hub: Hub | None = None) -> ModelMeta:
    """The model's GGUF header, read with range requests (a few MiB), as ``read_model_meta`` reads a file;
    ``file_size`` is the whole model's (all shards)."""
    from dataclasses import replace

    hub = hub or Hub.from_env()
    hub.require_online()
    first = model.files[0]
    with _explained(hub, model.repo_id, first.name):
        meta = read_model_meta_from(_RangeReader(hub, model.repo_id, first.name, first.size), first.size,
                                    PurePosixPath(first.name))  # type: ignore[arg-type]
    return replace(meta, file_size=model.size)


class _RangeReader:
    """A seekable reader over a Hub file, fetched in HEADER_BLOCK pieces with HTTP range requests through
    huggingface_hub's own session (its headers, token and proxies)."""

    def __init__(self, hub: Hub, repo_id: str, filename: str, size: int) -> None:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        self._url = hf_hub_url(repo_id, filename, endpoint=hub.endpoint)
        self._headers = build_hf_headers(token=hub.token)
        self._size, self._pos, self._fetched = size, 0, 0
        self._blocks: dict[int, bytes] = {}

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n < 0 else min(self._size, self._pos + n)
        out = bytearray()
        while self._pos < end:
            index = self._pos // HEADER_BLOCK
            block = self._block(index)
            start = self._pos - index * HEADER_BLOCK
            piece = block[start: start + end - self._pos]
            if not piece:
                break
            out += piece
            self._pos += len(piece)
        return bytes(out)

    def _block(self, index: int) -> bytes:
        if index not in self._blocks:
            if self._fetched >= MAX_HEADER:
                raise HubError("The model's header is too long to read over the network; download the file "
                               "to see what fits.", f"over {MAX_HEADER} bytes read", kind="other")
            from huggingface_hub.utils import get_session, hf_raise_for_status

            start = index * HEADER_BLOCK
            headers = {**self._headers, "Range": f"bytes={start}-{min(self._size, start + HEADER_BLOCK) - 1}"}
            response = get_session().get(self._url, headers=headers, follow_redirects=True, timeout=TIMEOUT_S)
            hf_raise_for_status(response)
            data = response.content
            if response.status_code == 200:  # the server ignored the range
                data = data[start: start + HEADER_BLOCK]
            self._fetched += len(data)
            if len(self._blocks) >= 8:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[index] = data
        return self._blocks[index]


class _explained:
    """A context manager turning huggingface_hub's and the network's exceptions into a HubError."""

    def __init__(self, hub: Hub, repo_id: str = "", filename: str = "") -> None:
        self.hub, self.repo_id, self.filename = hub, repo_id, filename

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: Any) -> bool:
        if err is None or isinstance(err, HubError) or not isinstance(err, Exception):
            return False
        raise explain(err, self.hub, self.repo_id, self.filename) from err


def http_library() -> ModuleType:
    """The HTTP client library huggingface_hub talks through, for its exceptions: httpx (huggingface_hub
    1.x) or httpx2 (2.x); both may be installed, so it is the one its session is made of."""
    from huggingface_hub.utils import get_session

    return importlib.import_module(type(get_session()).__module__.partition(".")[0])


def explain(err: Exception, hub: Hub, repo_id: str = "", filename: str = "") -> HubError:
    """The sentence for an exception from huggingface_hub or the network."""
    from huggingface_hub import errors

    details = f"{type(err).__name__}: {err}"
    repo = repo_id or "The repo"
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, errors.OfflineModeIsEnabled):
        return HubError("Offline mode is on (HF_HUB_OFFLINE is set): the Hub is not asked.", details,
                        "offline")
    if isinstance(err, errors.GatedRepoError):
        return HubError(
            f"{repo} is gated: accept its conditions on {hub.repo_url(repo_id)} while logged in, then set "
            "HF_TOKEN to an access token of that account (or run `hf auth login`).", details, "gated")
    if isinstance(err, errors.RepositoryNotFoundError):
        if status == 401 and hub.token:
            return HubError(f"The Hub refused the access token (HF_TOKEN) for {repo}: check that it is valid "
                            "and may read this repo.", details, "unauthorized")
        return HubError(f"{repo} was not found on {hub.endpoint} (or it is private: then set HF_TOKEN to an "
                        "access token that may read it).", details, "not_found")
    # no answer (and nothing cached)
    if isinstance(err, (errors.LocalEntryNotFoundError, http_library().TransportError)):
        return HubError(f"The Hub ({hub.endpoint}) cannot be reached: check the network connection (and "
                        "HF_ENDPOINT, if set), then try again.", details, "unreachable")
    if isinstance(err, (errors.EntryNotFoundError, errors.RevisionNotFoundError)):
        return HubError(f"{repo} has no file {filename or 'by that name'}.", details, "no_file")
    if status == 401:
        return HubError(f"The Hub asks for an access token for {repo}: set HF_TOKEN to one that may read it.",
                        details, "unauthorized")
    if status == 403:
        return HubError(f"The Hub refused access to {repo}: the access token (HF_TOKEN) may not read it.",
                        details, "forbidden")
    if isinstance(err, errors.HfHubHTTPError):
        return HubError(f"The Hub answered with an error ({status or 'no status'}); try again later.",
                        details, "other")
    return HubError(f"Talking to the Hub failed: {err}", details, "other")
