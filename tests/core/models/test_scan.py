"""The disk scan: every tool's folder on a fake home, each model once, split models whole, and a reason
for every file that is not offered."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lazykv.core.engine import planner
from lazykv.core.models.record import NOT_A_CHAT_MODEL, quant_of
from lazykv.core.models.scan import (
    FOLDER,
    GPT4ALL,
    HF_SOURCE,
    LAZYKV,
    LLAMA_CPP,
    LM_STUDIO,
    OLLAMA,
    Places,
    scan,
)
from tests.support.model_library import FakeHome


def _by_path(result) -> dict[Path, object]:  # type: ignore[no-untyped-def]
    return {r.path: r for r in result.records}


def test_every_tool_s_folder_is_found_and_nothing_is_copied(fake_home: FakeHome) -> None:
    before = sorted((p, p.stat().st_mtime_ns) for p in fake_home.places.home.rglob("*") if p.is_file())
    result = scan(fake_home.places)
    records = _by_path(result)
    files = fake_home.files
    expected = {"hf": HF_SOURCE, "lmstudio": LM_STUDIO, "ollama": OLLAMA, "gpt4all": GPT4ALL,
                "llamacpp": LLAMA_CPP, "folder": FOLDER, "split": LM_STUDIO, "lazykv": LAZYKV}
    for role, source in expected.items():
        record = records[files[role]]
        assert record.source == source, role
        assert record.usable, (role, record.problem)
        assert record.architecture == "llama" and record.n_ctx_train == 4096 and record.n_params > 0
    assert records[files["hf"]].label == "acme/Tiny-GGUF/tiny-Q8_0.gguf"
    assert records[files["hf"]].quant == "Q8_0"
    assert records[files["ollama"]].label == "tiny:latest"
    assert records[files["ollama"]].quant == "F16"  # from general.file_type: a blob's name says nothing
    assert records[files["lmstudio"]].name == "tiny-Q4_K_M"  # named by its file, as everywhere in the app
    assert result.notes == ()
    after = sorted((p, p.stat().st_mtime_ns) for p in fake_home.places.home.rglob("*") if p.is_file())
    assert after == before  # nothing written, moved or copied


def test_a_split_model_is_one_model_of_all_its_shards(fake_home: FakeHome) -> None:
    records = _by_path(scan(fake_home.places))
    first = fake_home.files["split"]
    shards = sorted(first.parent.glob("split-Q8_0-*.gguf"))
    assert len(shards) == 3
    assert not any(s in records for s in shards[1:])
    record = records[first]
    assert record.shards == tuple(shards)
    assert record.size == sum(s.stat().st_size for s in shards)
    assert record.meta is not None and record.meta.file_size == record.size  # the plan counts every shard
    full = records[fake_home.files["lmstudio"]]  # the same model in one file
    assert record.n_params == full.n_params  # the tensors of all shards
    assert full.meta is not None and record.meta.tensors is not None and full.meta.tensors is not None
    assert record.meta.tensors.total == full.meta.tensors.total
    assert [g.nbytes for g in record.meta.tensors.layers] == [g.nbytes for g in full.meta.tensors.layers]
    split_plan, whole_plan = (planner.plan(m, 4096, "lazy", available=8 << 30)
                              for m in (record.meta, full.meta))
    assert abs(split_plan.host.weights - whole_plan.host.weights) < 64 * 1024  # the shards' own headers


def test_a_split_model_missing_a_shard_says_which(fake_home: FakeHome) -> None:
    first = fake_home.files["split"]
    first.with_name(first.name.replace("00001", "00002")).unlink()
    record = _by_path(scan(fake_home.places))[first]
    assert not record.usable
    assert record.problem == "a split model missing shard 2 of 3"


def test_damaged_foreign_and_projector_files_get_a_reason_and_the_scan_goes_on(fake_home: FakeHome) -> None:
    records = _by_path(scan(fake_home.places))
    damaged = records[fake_home.files["damaged"]]
    assert not damaged.usable and "incomplete" in damaged.problem
    foreign = records[fake_home.files["foreign"]]
    assert not foreign.usable and "not a GGUF model file" in foreign.problem
    projector = records[fake_home.files["projector"]]
    assert projector.problem == NOT_A_CHAT_MODEL
    assert sum(r.usable for r in records.values()) == 8


def test_an_unreadable_folder_is_passed_over(fake_home: FakeHome) -> None:
    locked = fake_home.files["lmstudio"].parent
    os.chmod(locked, 0)
    try:
        records = _by_path(scan(fake_home.places))
    finally:
        os.chmod(locked, 0o755)
    assert fake_home.files["hf"] in records and fake_home.files["ollama"] in records


def test_the_hf_cache_follows_hf_hub_cache_then_hf_home(tmp_path: Path) -> None:
    home = tmp_path
    assert Places(home, {}).hf_cache() == home / ".cache" / "huggingface" / "hub"
    assert Places(home, {"HF_HOME": "/x/hf"}).hf_cache() == Path("/x/hf/hub")
    assert Places(home, {"HF_HOME": "/x/hf", "HF_HUB_CACHE": "/y"}).hf_cache() == Path("/y")
    assert Places(home, {"LLAMA_CACHE": "/z"}).llama_cpp() == Path("/z")
    assert Places(home, {"OLLAMA_MODELS": "/o"}).ollama() == Path("/o")


def test_an_empty_home_has_no_models(tmp_path: Path) -> None:
    result = scan(Places(tmp_path, {}))
    assert result.records == () and result.notes == ()


def test_quantization_from_file_names() -> None:
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("gemma-3-270m-q4_k_m.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf") == "Q4_K_M"
    assert quant_of("Qwen3-8B-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model-bf16.gguf") == "BF16"
    assert quant_of("model.gguf") == "" and quant_of("model.gguf", 15) == "Q4_K_M"


def test_a_hf_cache_that_is_a_file_is_a_note_and_the_rest_is_scanned(fake_home: FakeHome) -> None:
    cache = fake_home.places.hf_cache()
    shutil.rmtree(cache)
    cache.write_text("not a folder")
    result = scan(fake_home.places)
    (note,) = result.notes
    assert note.startswith("Hugging Face cache: cannot be read") and "expects a directory" in note
    assert fake_home.files["ollama"] in _by_path(result)
    assert all(r.source != HF_SOURCE for r in result.records)
