"""Settings: declared once, persisted with a schema version, bad files never fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lazykv.core.settings import GPU_LAYERS_AUTO, SCHEMA_VERSION, SETTINGS, SETTINGS_BY_NAME, Settings


def test_every_setting_is_declared_once_with_a_valid_default() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    for setting in SETTINGS:
        assert setting.validate(setting.default) == setting.default
        assert setting.label and setting.description


def test_defaults_when_there_is_no_file(tmp_path: Path) -> None:
    settings = Settings.load(tmp_path / "settings.json")
    assert settings["kv_mode"] == "lazy" and settings["idle_conversion"] is True
    assert settings.problems == []


def test_values_survive_save_and_load(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "settings.json"
    settings = Settings(path)
    assert settings.set("n_ctx", 2048) and settings.set("kv_mode", "f16")
    assert not settings.set("n_ctx", 2048)
    settings.add_recent_model("/models/a.gguf")
    settings.add_recent_model("/models/b.gguf")
    settings.add_recent_model("/models/a.gguf")
    settings.save()
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == SCHEMA_VERSION
    again = Settings.load(path)
    assert again["n_ctx"] == 2048 and again["kv_mode"] == "f16"
    assert again["recent_models"] == ["/models/a.gguf", "/models/b.gguf"]
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temp file left


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("n_ctx", 10, "below the minimum"),
        ("n_ctx", 1.5, "whole number"),
        ("kv_mode", "q4", "not one of"),
        ("flash_attn", "yes", "true/false"),
        ("temperature", "hot", "a number"),
    ],
)
def test_invalid_values_are_refused(tmp_path: Path, name: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(tmp_path / "s.json").set(name, value)


def test_a_bad_value_in_the_file_falls_back_to_its_default(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION,
                                "settings": {"n_ctx": -5, "top_k": 7, "no_such_option": 1}}))
    settings = Settings.load(path)
    assert settings["n_ctx"] == SETTINGS_BY_NAME["n_ctx"].default
    assert settings["top_k"] == 7
    assert len(settings.problems) == 1 and "n_ctx" in settings.problems[0]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\udcff"])
def test_a_corrupt_file_gives_defaults_and_a_problem(tmp_path: Path, content: str) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(content.encode("utf-8", errors="surrogateescape"))
    settings = Settings.load(path)
    assert settings["kv_mode"] == "lazy"
    assert settings.problems


def test_a_newer_schema_is_not_guessed_at(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "settings": {"n_ctx": 2048}}))
    settings = Settings.load(path)
    assert settings["n_ctx"] == 4096
    assert "newer LazyKV Chat" in settings.problems[0]


def test_version_1_files_are_migrated(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 1, "settings": {"kv": "q8_0", "recent": ["/m.gguf"]}}))
    settings = Settings.load(path)
    assert settings["kv_mode"] == "q8_0" and settings["recent_models"] == ["/m.gguf"]
    assert settings.problems == []


def test_version_2_gpu_layers_0_become_auto_and_a_count_stays(tmp_path: Path) -> None:
    """Version 2 had no Auto: its 0 (the default, the only choice of a CPU build) is Auto now (issue 26)."""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": 2, "settings": {"n_gpu_layers": 0, "n_ctx": 2048}}))
    settings = Settings.load(path)
    assert settings["n_gpu_layers"] == GPU_LAYERS_AUTO and settings["n_ctx"] == 2048 and not settings.problems
    path.write_text(json.dumps({"schema_version": 2, "settings": {"n_gpu_layers": 20}}))
    assert Settings.load(path)["n_gpu_layers"] == 20
    assert Settings()["n_gpu_layers"] == GPU_LAYERS_AUTO and Settings()["gpu_memory_mb"] == 0  # new defaults
    settings.set("n_gpu_layers", 0)
    settings.save()
    assert Settings.load(path)["n_gpu_layers"] == 0  # a 0 chosen now (schema 3) stays 0


def test_a_newer_file_is_never_saved_over(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    newer = json.dumps({"schema_version": SCHEMA_VERSION + 1, "settings": {"n_ctx": 2048, "future": 1}})
    path.write_text(newer)
    settings = Settings.load(path)
    assert "changes made now are not saved" in settings.problems[0]
    settings.set("n_ctx", 8192)
    settings.save()
    settings.copy().save()  # as the window saves: a copy, on its background thread
    assert path.read_text() == newer


def test_every_setting_kind_has_a_validator() -> None:
    from lazykv.core.kinds import SettingKind
    from lazykv.core.settings import _VALIDATORS

    assert set(_VALIDATORS) == set(SettingKind)
    assert {s.kind for s in SETTINGS} <= set(SettingKind)


def test_the_idle_description_states_the_idle_constants() -> None:
    from lazykv.core.idle import IDLE_DELAY_S, IDLE_FILL

    text = SETTINGS_BY_NAME["idle_conversion"].description
    assert f"{IDLE_FILL:.0%}" in text and f"{IDLE_DELAY_S:g} s" in text


def test_the_ladder_and_a_context_budget_survive_save_and_load(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    settings = Settings(path)
    assert settings["context_budget_mb"] == 0  # by default the context length decides
    assert settings.set("kv_mode", "ladder") and settings.set("context_budget_mb", 2048)
    settings.save()
    again = Settings.load(path)
    assert (again["kv_mode"], again["context_budget_mb"]) == ("ladder", 2048) and again.problems == []
    with pytest.raises(ValueError, match="below the minimum"):
        again.set("context_budget_mb", -1)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "settings": {"context_budget_mb": "2 GB"}}))
    bad = Settings.load(path)
    assert bad["context_budget_mb"] == 0 and "context_budget_mb" in bad.problems[0]


def test_every_kv_mode_is_offered_with_a_one_line_note() -> None:
    from lazykv.core.kinds import KvMode

    kv_mode = SETTINGS_BY_NAME["kv_mode"]
    assert [v for v, _ in kv_mode.choices] == [KvMode.LAZY, KvMode.LADDER, KvMode.Q8_0, KvMode.F16]
    notes = dict(kv_mode.choice_notes)
    assert set(notes) == set(KvMode) and all("\n" not in note for note in notes.values())
    assert "3.5× the tokens of f16" in notes[KvMode.LADDER] and "trades some quality" in notes[KvMode.LADDER]
    assert "0 = use the context length" == SETTINGS_BY_NAME["context_budget_mb"].special
