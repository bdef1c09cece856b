"""The model fingerprint: cached while the file is the same, re-hashed when it was replaced or rewritten."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from lazykv.core.engine import fingerprint
from lazykv.core.engine.fingerprint import model_sha256


def _write_model(path: Path, fill: int, size: int = 3 * 1024 * 1024 + 17) -> str:
    data = bytes([fill]) * size
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _same_times(path: Path, like: os.stat_result) -> None:
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))


def test_an_unchanged_file_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "fp.json"
    expected = _write_model(model, 1)
    assert model_sha256(model, cache) == expected
    monkeypatch.setattr(fingerprint, "_full_sha256", lambda path: pytest.fail("hashed again"))
    assert model_sha256(model, cache) == expected
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600


def test_a_model_rewritten_in_place_with_its_old_size_and_mtime_is_hashed_again(tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "fp.json"
    _write_model(model, 1)
    before = model.stat()
    first = model_sha256(model, cache)
    with model.open("r+b") as f:  # other weights, same path, same size
        f.seek(2 * 1024 * 1024)
        f.write(b"\x02" * 1000)
    _same_times(model, before)
    assert (model.stat().st_size, model.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = model_sha256(model, cache)
    assert second != first and second == hashlib.sha256(model.read_bytes()).hexdigest()


def test_a_model_replaced_by_another_file_with_the_same_size_and_mtime_is_hashed_again(
    tmp_path: Path,
) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "fp.json"
    _write_model(model, 1)
    before = model.stat()
    first = model_sha256(model, cache)
    other = tmp_path / "other.gguf"
    expected = _write_model(other, 3)
    _same_times(other, before)
    os.replace(other, model)
    assert model_sha256(model, cache) == expected != first


def test_a_change_the_stat_cannot_see_is_caught_by_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "fp.json"
    _write_model(model, 1)
    first = model_sha256(model, cache)
    real_identity = fingerprint.file_identity
    frozen = {k: v for k, v in real_identity(model).items() if k != "sample"}
    monkeypatch.setattr(fingerprint, "file_identity",
                        lambda path: frozen | {"sample": real_identity(path)["sample"]})  # fmt: skip
    with model.open("r+b") as f:  # the first bytes are always sampled
        f.write(b"\x07" * 16)
    assert model_sha256(model, cache) != first


def test_a_cache_of_the_older_format_is_ignored(tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "fp.json"
    expected = _write_model(model, 5)
    info = model.stat()
    cache.write_text(f'{{"{model.resolve()}|{info.st_size}|{info.st_mtime_ns}": "{"0" * 64}"}}')
    assert model_sha256(model, cache) == expected


def test_a_split_model_s_fingerprint_covers_every_shard(tmp_path: Path) -> None:
    """The snapshot binding is to the whole model: a split model's sha256 is that of all its shards in
    order, and replacing a later shard (same size, same times) changes it."""
    names = [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    parts = []
    for i, name in enumerate(names):
        data = bytes([i + 1]) * (1024 * 1024 + i)
        (tmp_path / name).write_bytes(data)
        parts.append(data)
    cache = tmp_path / "fp.json"
    first = tmp_path / names[0]
    assert model_sha256(first, cache) == hashlib.sha256(b"".join(parts)).hexdigest()
    third = tmp_path / names[2]
    before = third.stat()
    with third.open("r+b") as f:  # other weights in the last shard only
        f.seek(512 * 1024)
        f.write(b"\xff" * 4096)
    _same_times(third, before)
    changed = parts[2][: 512 * 1024] + b"\xff" * 4096 + parts[2][512 * 1024 + 4096:]
    assert model_sha256(first, cache) == hashlib.sha256(parts[0] + parts[1] + changed).hexdigest()
    third.unlink()
    with pytest.raises(FileNotFoundError):
        model_sha256(first, cache)
