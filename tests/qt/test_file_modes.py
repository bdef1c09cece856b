"""Every file and folder the app creates in its data and config folders is the user's only (issue 24.13):
0600 and 0700, the window state and its .ini included, whatever the umask (a desktop's is often 022)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import ENCRYPTION_NONE
from lazykv.core.paths import config_dir, data_dir
from lazykv.qt.single_instance import SingleInstance
from lazykv.server.prefix_cache import Binding, PrefixCache
from tests.qt.conftest import FakeWindow
from tests.qt.helpers import WAIT_MS, settle
from tests.qt.test_history_protection import give_passphrase

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


@pytest.fixture
def desktop_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def not_private(folder: Path) -> list[str]:
    """What under ``folder`` (itself included) others could read: modes other than 0700 and 0600."""
    wrong = []
    for path in [folder, *folder.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir() and mode != 0o700 or path.is_file() and mode != 0o600:
            wrong.append(f"{path.relative_to(folder.parent)} {mode:o}")
    return wrong


def test_everything_in_the_data_and_config_folders_is_the_users_only(
    qtbot: QtBot, fake_window: FakeWindow, desktop_umask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, config = data_dir() / "lazykv", config_dir() / "lazykv"  # folders the app itself makes
    monkeypatch.setenv("LAZYKV_DATA_DIR", str(data))
    monkeypatch.setenv("LAZYKV_CONFIG_DIR", str(config))
    instance = SingleInstance(data, QApplication.instance())
    assert instance.claim()
    w = fake_window(snapshot_encryption="passphrase")
    give_passphrase(qtbot, w)
    with qtbot.waitSignal(w.conversations.snapshot_saved, timeout=WAIT_MS):
        w.chat.send_text("Hello")
    settle(qtbot, w)
    w.apply_settings({"temperature": 0.5})  # settings.json
    binding = Binding("ab" * 32, 256, "lazy", "0")
    PrefixCache(data / "api-cache", binding, Crypto(ENCRYPTION_NONE), 1 << 20)  # the local API's
    assert w.close()  # the window state: window.ini
    assert w.shutdown_engine()
    names = {p.name for p in [*data.rglob("*"), *config.rglob("*")]}
    assert {"window.ini", "settings.json", "passphrase.json", "conversations.sqlite3", "snapshots",
            "fingerprints.json", "lazykv.lock", "api-cache"} <= names, names
    assert any(name.endswith(".lkv") for name in names)
    wrong = not_private(data) + not_private(config)
    assert wrong == [], "\n".join(wrong)
