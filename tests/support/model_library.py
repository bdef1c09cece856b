"""The model library's fixtures: a fake home holding each tool's model folders, and a fake Hub.

Shared by tests/core/models and the Models page's GUI tests (their conftest or module imports them)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lazykv.core.models.hub import Hub
from lazykv.core.models.scan import Places
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

if TYPE_CHECKING:
    from tests.support.fake_hub import FakeHub

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the fake Hub's (and the fake cache's) one revision


@pytest.fixture(autouse=True)
def _never_the_real_hub(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test: the Hub is a closed local port unless the test starts the fake one (hub_env), and the
    Hugging Face cache and token are a fresh folder's, never the user's."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    for name in ("HF_TOKEN", "HF_HUB_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True)
class FakeHome:
    places: Places
    files: dict[str, Path]  # what was put where, by role


def put_in_hf_cache(cache: Path, repo_id: str, name: str, data: bytes) -> Path:
    """A file laid out as huggingface_hub's cache lays it out: blob by sha256, snapshot link, ref."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    sha = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / sha).write_bytes(data)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    link = repo / "snapshots" / COMMIT / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("../..") / "blobs" / sha)
    return link


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", SyntheticShape(name="Tiny Chat"))


@pytest.fixture(scope="session")
def big_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~25 MiB: huggingface_hub reports progress per 10 MiB read."""
    shape = SyntheticShape(n_vocab=12288, name="Big Chat")
    return write_llama_gguf(tmp_path_factory.mktemp("big") / "big.gguf", shape)


@pytest.fixture(scope="session")
def split_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A split model's three shards (gguf-split naming), by file name."""
    folder = tmp_path_factory.mktemp("split")
    write_llama_gguf(folder / "split-Q8_0.gguf", SyntheticShape(name="Split Chat"), split_max_tensors=10)
    return {p.name: p.read_bytes() for p in sorted(folder.glob("split-Q8_0-*.gguf"))}


@pytest.fixture
def fake_home(tmp_path: Path, tiny_gguf: Path, split_shards: dict[str, bytes]) -> FakeHome:
    """A home with a model in each tool's folder, a split model, a projector, a damaged and a foreign file."""
    home = tmp_path / "home"
    data = tiny_gguf.read_bytes()
    files: dict[str, Path] = {}
    env = {"HF_HOME": str(home / "hf"), "LLAMA_CACHE": str(home / "llamacache"),
           "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CACHE_HOME": str(home / ".cache")}
    files["hf"] = put_in_hf_cache(home / "hf" / "hub", "acme/Tiny-GGUF", "tiny-Q8_0.gguf", data)
    lms = home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF"
    lms.mkdir(parents=True)
    files["lmstudio"] = lms / "tiny-Q4_K_M.gguf"
    files["lmstudio"].write_bytes(data + b"\0")  # another file, not the HF blob
    files["projector"] = lms / "mmproj-tiny-f16.gguf"
    files["projector"].write_bytes(data)
    split_dir = home / ".cache" / "lm-studio" / "models" / "acme" / "Split-GGUF"
    split_dir.mkdir(parents=True)
    for name, shard in split_shards.items():
        (split_dir / name).write_bytes(shard)
    files["split"] = split_dir / min(split_shards)
    damaged = lms / "damaged-Q8_0.gguf"
    damaged.write_bytes(data[: len(data) // 3])  # an interrupted copy
    files["damaged"] = damaged
    ollama = home / ".ollama" / "models"
    blob = "sha256-" + hashlib.sha256(data + b"\0\0").hexdigest()
    (ollama / "blobs").mkdir(parents=True)
    (ollama / "blobs" / blob).write_bytes(data + b"\0\0")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": blob.replace("-", ":", 1),
         "size": len(data) + 2},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]}))
    files["ollama"] = ollama / "blobs" / blob
    gpt4all = home / ".local" / "share" / "nomic.ai" / "GPT4All"
    gpt4all.mkdir(parents=True)
    files["gpt4all"] = gpt4all / "tiny-chat.Q4_0.gguf"
    files["gpt4all"].write_bytes(data + b"\0\0\0")
    llama_cache = home / "llamacache"
    llama_cache.mkdir()
    files["foreign"] = llama_cache / "notes.gguf"
    files["foreign"].write_text("not a model, only a name that says it is\n")
    files["llamacpp"] = llama_cache / "acme_Tiny-GGUF_tiny-Q5_0.gguf"
    files["llamacpp"].write_bytes(data + b"\0\0\0\0")
    own = home / ".cache" / "lazykv" / "models"  # what `make models` fetched
    own.mkdir(parents=True)
    files["lazykv"] = own / "demo.Q4_1.gguf"
    files["lazykv"].write_bytes(data + b"\0" * 6)
    folder = tmp_path / "my-models"
    folder.mkdir()
    files["folder"] = folder / "mine-F16.gguf"
    files["folder"].write_bytes(data + b"\0" * 5)
    return FakeHome(Places(home, env, (folder,)), files)


@pytest.fixture
def fake_hub(tiny_gguf: Path, big_gguf: Path, split_shards: dict[str, bytes]) -> Iterator[FakeHub]:
    """A Hub on 127.0.0.1 with a few GGUF repos (a split one, a gated one, a private one)."""
    from tests.support.fake_hub import FakeHub, FakeRepo  # uvicorn and Starlette only where a test needs them

    tiny, big, shards = tiny_gguf.read_bytes(), big_gguf.read_bytes(), split_shards
    hub = FakeHub()
    hub.add(FakeRepo("acme/Tiny-GGUF", {"tiny-Q8_0.gguf": tiny, "tiny-Q4_K_M.gguf": tiny + b"\0",
                                        "mmproj-tiny-f16.gguf": tiny[:4096], "README.md": b"# Tiny\n"},
                     downloads=900))
    hub.add(FakeRepo("acme/Big-GGUF", {"big-Q8_0.gguf": big}, downloads=500))
    hub.add(FakeRepo("acme/Split-GGUF", shards, downloads=300))
    hub.add(FakeRepo("acme/Liar-GGUF", {"liar-Q8_0.gguf": tiny}, downloads=200,
                     lie=frozenset({"liar-Q8_0.gguf"})))
    hub.add(FakeRepo("acme/Gated-GGUF", {"gated-Q8_0.gguf": tiny}, downloads=100, gated=True,
                     granted_tokens=frozenset({"hf_granted"})))
    hub.add(FakeRepo("acme/Private-GGUF", {"private-Q8_0.gguf": tiny}, private=True,
                     granted_tokens=frozenset({"hf_granted"})))
    hub.add(FakeRepo("acme/Safetensors-only", {"model.safetensors": b"\0" * 64}))
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def hub_env(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment pointing at the fake Hub, with an empty cache of its own (no token anywhere)."""
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return env


@pytest.fixture
def hub(hub_env: dict[str, str]) -> Hub:
    return Hub.from_env(hub_env)


@pytest.fixture
def places(hub_env: dict[str, str], tmp_path: Path) -> Places:
    return Places(tmp_path / "home", dict(hub_env))
