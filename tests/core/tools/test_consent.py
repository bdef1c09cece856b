"""Consent: only "Always allow" is remembered, per server and tool; a Private chat's store writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv.core.paths import tool_permissions_file
from lazykv.core.tools.consent import ConsentStore, Decision


def test_always_is_remembered_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "perm.json"
    ConsentStore(path).record("files", "read", Decision.ALWAYS)
    again = ConsentStore(path)
    assert again.allowed("files", "read")
    assert not again.allowed("files", "write") and not again.allowed("other", "read")
    assert again.remembered() == [("files", "read")]


def test_allow_once_and_deny_are_not_remembered(tmp_path: Path) -> None:
    path = tmp_path / "perm.json"
    store = ConsentStore(path)
    store.record("files", "read", Decision.ALLOW_ONCE)
    store.record("files", "write", "deny")
    assert not store.allowed("files", "read") and not store.allowed("files", "write")
    assert store.remembered() == [] and not path.exists()


def test_revoke(tmp_path: Path) -> None:
    path = tmp_path / "perm.json"
    store = ConsentStore(path)
    store.record("a", "t", Decision.ALWAYS)
    store.record("b", "t", Decision.ALWAYS)
    store.revoke("a", "t")
    assert not store.allowed("a", "t") and store.allowed("b", "t")
    assert ConsentStore(path).remembered() == [("b", "t")]


def test_in_memory_store_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = ConsentStore(None)
    store.record("a", "t", Decision.ALWAYS)
    assert store.allowed("a", "t")
    assert list(tmp_path.rglob("*")) == [] and not tool_permissions_file().exists()
    assert not ConsentStore(None).allowed("a", "t")


def test_damaged_file_allows_nothing_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "perm.json"
    path.write_text("{", encoding="utf-8")
    store = ConsentStore(path)
    assert store.remembered() == [] and "could not be read" in store.problem
