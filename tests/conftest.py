"""Shared fixtures: the real test models and small real engine contexts.

The models are fetched by `make models` (part of `make test`); a missing model
is an error, never a skip. Every test that uses a real model is marked ``slow``
here, so `make test-fast` (``-m "not slow"``) runs the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest

from lazykv.core.models import model_fetch
from tests.support.memory_keyring import MemoryKeyring

# the model library's fake home and fake Hub (tests/core/models, tests/qt/test_models_dialog.py)
pytest_plugins = ["tests.support.model_library"]

REAL_MODEL_FIXTURES = frozenset({"smollm2_path", "gemma3_path", "model_path"})


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker every engine context the tests make takes one thread.

    `make test` runs two workers on the two cores it is sized for; with the engine's default of a
    thread per core they would run four threads on two cores, each waiting at the graph's barriers
    for a thread that is not running. Contexts the tests build themselves read LAZYKV_TEST_THREADS
    (`tests/native/rawctx.engine_threads`, also in their child processes); the app's engine sessions
    take `default_threads()`, which is replaced here for the worker's whole run.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ.setdefault("LAZYKV_TEST_THREADS", "1")
    threads = int(os.environ["LAZYKV_TEST_THREADS"])
    from lazykv.core.engine import engine

    engine.default_threads = lambda: threads


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Real-model tests are ``slow``: those whose fixtures (directly or through others) include a model."""
    for item in items:
        if REAL_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _model_path(name: str) -> Path:
    path = model_fetch.models_dir() / model_fetch.MODELS[name].filename
    if not path.exists():
        pytest.fail(f"test model {name} missing at {path}: run `make models`")
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1: llama arch, head dim 64."""
    return _model_path("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma-3-270M Q4_K_M: gemma3 arch with an iSWA cache, head dim 256."""
    return _model_path("gemma3")


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def model_path(request: pytest.FixtureRequest) -> Path:
    """Each real test model in turn."""
    return _model_path(request.param)


@pytest.fixture
def attn_rot_disabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Contexts created inside the test run with LLAMA_ATTN_ROT_DISABLE=1."""
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    yield


@pytest.fixture(autouse=True)
def _config_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty settings dir: the user's real settings are never read or written."""
    path = tmp_path_factory.mktemp("config")
    monkeypatch.setenv("LAZYKV_CONFIG_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty data dir (conversations, snapshots)."""
    path = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("LAZYKV_DATA_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _memory_keyring() -> Iterator[MemoryKeyring]:
    """The OS keyring is replaced by an in-memory one (a test may set another backend)."""
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture(autouse=True)
def _engine_env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from the engine's defaults, whatever the calling shell exported."""
    for var in ("LLAMA_ATTN_ROT_DISABLE", "LLAMA_KV_CACHE_LAZY_QUANT"):
        monkeypatch.delenv(var, raising=False)
