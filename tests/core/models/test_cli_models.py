"""``python -m lazykv models``: list (the fake home), search and get (the fake Hub), text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lazykv.cli import models as cli
from lazykv.core.engine import memory
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import Fit
from lazykv.core.models.fit import fit_report
from lazykv.core.models.scan import Places, scan
from tests.support.fake_hub import FakeHub
from tests.support.model_library import FakeHome


@pytest.fixture
def home_env(fake_home: FakeHome, monkeypatch: pytest.MonkeyPatch) -> FakeHome:
    monkeypatch.setenv("HOME", str(fake_home.places.home))
    for name, value in fake_home.places.env.items():
        monkeypatch.setenv(name, value)
    return fake_home


def test_list_json_is_the_scan_with_the_planner_s_fit(home_env: FakeHome, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_ram", lambda: 3 * 1024**3)  # the same RAM for both sides
    folder = str(home_env.places.folders[0])
    assert cli.main(["list", "--json", "--folder", folder, "--ctx", "2048", "--kv", "ladder"]) == 0
    out = json.loads(capsys.readouterr().out)
    records = scan(Places.current([folder])).records
    assert [m["path"] for m in out["models"]] == [str(r.path) for r in records]
    for shown, record in zip(out["models"], records, strict=True):
        if record.usable:
            assert record.meta is not None
            spec = LoadSpec(record.path, n_ctx=2048, kv_mode="ladder")
            assert shown["fit"] == fit_report(record.meta, spec).to_json()
            assert shown["fit"]["fit"] in {f.value for f in Fit}
        else:
            assert shown["fit"] is None and shown["problem"] == record.problem


def test_list_text_names_each_model_and_each_problem(home_env: FakeHome,
                                                     capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "[Ollama: tiny:latest]" in out and "[Hugging Face cache: acme/Tiny-GGUF/tiny-Q8_0.gguf]" in out
    assert "3 shards" in out and "not offered: a projector (mmproj)" in out
    assert "longest context: f16 " in out


def test_search_and_a_repo_s_files(hub_env: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["search", "tiny", "--json"]) == 0
    assert [r["repo_id"] for r in json.loads(capsys.readouterr().out)] == ["acme/Tiny-GGUF"]
    assert cli.main(["get", "acme/Tiny-GGUF", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)
    assert [f["file"] for f in files] == ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"]
    assert files[0]["fit"]["max_ctx"]["ladder"] > 0 and files[-1]["fit"] is None
    assert cli.main(["get", "acme/Tiny-GGUF"]) == 2  # two chat models (and a projector): choose one
    assert "Download one with" in capsys.readouterr().out


def test_an_unknown_repo_says_not_found(hub_env: dict[str, str], capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["get", "acme/Nope"]) == 1
    assert "was not found" in capsys.readouterr().err


@pytest.mark.slow
def test_get_downloads_into_the_hf_cache(hub_env: dict[str, str], fake_hub: FakeHub,
                                         capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["get", "acme/Tiny-GGUF", "--file", "tiny-Q8_0.gguf"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_relative_to(Path(hub_env["HF_HOME"]) / "hub")
    assert path.read_bytes() == fake_hub.repos["acme/Tiny-GGUF"].files["tiny-Q8_0.gguf"]


@pytest.mark.slow
def test_get_a_repo_with_one_model_downloads_it_whole(hub_env: dict[str, str], fake_hub: FakeHub,
                                                      capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["get", "acme/Split-GGUF"]) == 0
    first = Path(capsys.readouterr().out.strip())
    shards = fake_hub.repos["acme/Split-GGUF"].files
    assert first.name == min(shards)
    assert {p.name: p.read_bytes() for p in first.parent.iterdir()} == shards
