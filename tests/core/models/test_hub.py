"""The Hub through huggingface_hub, against a fake Hub on 127.0.0.1: search, a repo's files, a header read
with range requests, and each failure as a sentence."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.models.hub import Hub, HubError, read_header, repo_models, search
from lazykv.core.models.record import NOT_A_CHAT_MODEL
from tests.support.fake_hub import FakeHub


def test_search_lists_gguf_repos_most_downloaded_first(hub: Hub) -> None:
    found = search("gguf", hub=hub)
    assert [r.repo_id for r in found] == ["acme/Tiny-GGUF", "acme/Big-GGUF", "acme/Split-GGUF",
                                          "acme/Liar-GGUF", "acme/Gated-GGUF"]
    assert found[-1].gated
    assert [r.repo_id for r in search("tiny", hub=hub)] == ["acme/Tiny-GGUF"]
    assert search("nothing-like-it", hub=hub) == []


def test_a_repo_s_files_with_the_sizes_and_sha256_the_hub_reports(hub: Hub, fake_hub: FakeHub) -> None:
    models = repo_models("acme/Tiny-GGUF", hub)
    assert [m.name for m in models] == ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"]
    repo = fake_hub.repos["acme/Tiny-GGUF"]
    for model in models:
        (f,) = model.files
        assert f.size == len(repo.files[f.name]) and f.sha256 == repo.sha(f.name)
    assert [m.quant for m in models] == ["Q4_K_M", "Q8_0", "F16"]
    assert models[-1].problem == NOT_A_CHAT_MODEL and not models[0].problem


def test_a_split_repo_lists_one_model_of_all_shards(hub: Hub, fake_hub: FakeHub) -> None:
    (model,) = repo_models("acme/Split-GGUF", hub)
    assert [f.name for f in model.files] == sorted(fake_hub.repos["acme/Split-GGUF"].files)
    assert model.size == sum(len(d) for d in fake_hub.repos["acme/Split-GGUF"].files.values())
    assert model.quant == "Q8_0" and not model.problem


def test_the_header_is_read_with_range_requests_as_from_the_file(hub: Hub, fake_hub: FakeHub,
                                                                tiny_gguf: Path) -> None:
    model = next(m for m in repo_models("acme/Tiny-GGUF", hub) if m.name == "tiny-Q8_0.gguf")
    fake_hub.requests.clear()
    meta = read_header(model, hub)
    local = read_model_meta(tiny_gguf)
    fields = ("architecture", "n_layer", "n_head_kv", "head_k", "n_ctx_train", "n_params", "name")
    assert [getattr(meta, f) for f in fields] == [getattr(local, f) for f in fields]
    assert meta.file_size == model.size
    ranges = [r for m, p, r in fake_hub.requests if m == "GET"]
    assert ranges and all(r.startswith("bytes=") for r in ranges)


def test_an_unknown_repo_is_not_found(hub: Hub) -> None:
    with pytest.raises(HubError) as err:
        repo_models("acme/No-Such-Repo", hub)
    assert err.value.kind == "not_found" and "was not found" in str(err.value)


def test_a_private_repo_without_a_token_is_not_found_and_with_one_is_listed(hub: Hub) -> None:
    with pytest.raises(HubError) as err:
        repo_models("acme/Private-GGUF", hub)
    assert err.value.kind == "not_found" and "HF_TOKEN" in str(err.value)
    granted = Hub(hub.endpoint, token="hf_granted")
    assert [m.name for m in repo_models("acme/Private-GGUF", granted)] == ["private-Q8_0.gguf"]


def test_a_gated_header_says_how_to_get_access(hub: Hub) -> None:
    (model,) = repo_models("acme/Gated-GGUF", hub)
    with pytest.raises(HubError) as err:
        read_header(model, hub)
    assert err.value.kind == "gated"
    assert f"{hub.endpoint}/acme/Gated-GGUF" in str(err.value) and "HF_TOKEN" in str(err.value)


def test_offline_mode_asks_nothing(hub_env: dict[str, str], fake_hub: FakeHub) -> None:
    offline = Hub.from_env({**hub_env, "HF_HUB_OFFLINE": "1"})
    fake_hub.requests.clear()
    with pytest.raises(HubError) as err:
        search("tiny", hub=offline)
    assert err.value.kind == "offline" and "HF_HUB_OFFLINE" in str(err.value)
    assert fake_hub.requests == []


def test_no_network_says_the_hub_cannot_be_reached() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    started = time.monotonic()
    with pytest.raises(HubError) as err:
        search("tiny", hub=Hub(f"http://127.0.0.1:{port}"))
    assert err.value.kind == "unreachable" and "cannot be reached" in str(err.value)
    assert time.monotonic() - started < 10  # said at once (huggingface_hub 2's list_models retried for 23 s)


def test_the_environment_names_the_hub_and_the_token(hub_env: dict[str, str]) -> None:
    hub = Hub.from_env({**hub_env, "HF_TOKEN": "hf_granted", "HF_ENDPOINT": hub_env["HF_ENDPOINT"] + "/"})
    assert hub.endpoint == hub_env["HF_ENDPOINT"] and hub.token == "hf_granted" and not hub.offline
    assert [m.name for m in repo_models("acme/Private-GGUF", hub)] == ["private-Q8_0.gguf"]
    assert Hub.from_env({}).endpoint == "https://huggingface.co" and Hub.from_env({}).token is None
    assert all(Hub.from_env({"HF_HUB_OFFLINE": v}).offline for v in ("1", "true", "ON", "yes"))
    assert not Hub.from_env({"HF_HUB_OFFLINE": "0"}).offline
