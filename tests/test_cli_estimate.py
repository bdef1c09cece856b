"""``python -m lazykv estimate MODEL`` (issue 26): the user's view of the memory plan, text or JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lazykv.cli import estimate
from lazykv.core.engine.memory import MiB, plan_context, tokens_per_gib, window_bytes
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.planner import max_ctx_per_mode, plan
from lazykv.core.kinds import DEFAULT_KV_RECENT, DEFAULT_KV_SINKS, KvMode
from lazykv.core.models.fit import fit_report
from lazykv.core.settings import Settings, load_spec
from tests.support.rpc_server import rpc_server

WINDOW = DEFAULT_KV_RECENT + DEFAULT_KV_SINKS  # the app's f16 slots beside a lazy cache: recent window, sinks

KEYS = {"n_gpu_layers", "fit", "host", "devices", "max_ctx", "tokens_per_gib"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = estimate.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_is_one_object_with_the_plans_figures(tiny_gguf: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(tiny_gguf), "--ctx", "2048", "--kv", "ladder", "--json")
    assert code == 0
    got = json.loads(out)
    assert set(got) == KEYS and set(got["host"]) == {"weights", "kv", "compute"}
    assert set(got["max_ctx"]) == {"f16", "q8_0", "lazy", "ladder"}
    meta = read_model_meta(tiny_gguf)
    p = plan(meta, 2048, "ladder", recent=WINDOW)  # the app's window and sinks, by default
    assert got["n_gpu_layers"] == 0 and got["devices"] == []  # a CPU build: no GPU here
    assert got["host"] == {"weights": p.host.weights, "kv": p.host.kv, "compute": p.host.compute}
    assert got["fit"] in ("green", "yellow", "red")
    longest = got["max_ctx"]
    assert longest["ladder"] >= longest["q8_0"] >= longest["lazy"] >= longest["f16"]


@pytest.mark.parametrize("kv", ["lazy", "ladder", "q8_0"])
def test_recent_window_is_counted_with_the_kv_cache(tiny_gguf: Path, capsys: pytest.CaptureFixture[str],
                                                    kv: str) -> None:
    """--kv-recent N adds the window's f16 rows to the KV cache of the lazy modes (a plain cache has none)."""
    figures = {}
    for recent in ("0", "256"):
        code, out, _ = run(capsys, str(tiny_gguf), "--ctx", "2048", "--kv", kv, "--kv-recent", recent,
                           "--json")
        assert code == 0
        figures[recent] = json.loads(out)["host"]["kv"]
    meta = read_model_meta(tiny_gguf)
    # the sinks stay in both: the window adds its 256 rows to theirs
    assert figures["256"] - figures["0"] == (window_bytes(meta, 2048, kv, 256 + DEFAULT_KV_SINKS)
                                             - window_bytes(meta, 2048, kv, DEFAULT_KV_SINKS))
    assert (window_bytes(meta, 2048, kv, 256) > 0) == (kv != "q8_0")


def test_text_says_the_layers_the_places_and_the_longest_contexts(
    tiny_gguf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, str(tiny_gguf), "--ctx", "1024", "--kv", "f16")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{tiny_gguf.name}, context 1024, KV f16: ")
    assert lines[1].startswith("n_gpu_layers 0 of ") and "runs on the CPU" in lines[1]
    assert lines[2].startswith("host memory (CPU): weights ")
    assert lines[-5].startswith("longest context: f16 ")
    # each mode's tokens per GiB and quality, in the words of Settings and the Models page
    meta = read_model_meta(tiny_gguf)
    context = plan_context(meta, 1024, "f16", recent=WINDOW)
    assert lines[-4:] == [f"  {context.figures(mode)}" for mode in KvMode]
    lazy = tokens_per_gib(meta, 1024, "lazy", WINDOW)
    assert lines[-2] == (f"  lazy q8_0 (f16 until half full): {lazy:,} tokens per GiB · exact until the f16 "
                         "part is full, then closer to f16 than plain 8-bit")


def test_every_place_gives_the_same_tokens_per_gib(tiny_gguf: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """estimate's JSON, the Models page's fit report and the plan Settings and the memory panel show: one
    figure per mode, from memory.tokens_per_gib."""
    code, out, _ = run(capsys, str(tiny_gguf), "--ctx", "2048", "--json")
    assert code == 0
    meta = read_model_meta(tiny_gguf)
    spec = load_spec(Settings().values(), tiny_gguf, n_ctx=2048)
    want = {str(mode): tokens_per_gib(meta, 2048, mode, WINDOW) for mode in KvMode}
    assert json.loads(out)["tokens_per_gib"] == want
    assert fit_report(meta, spec, available=1 << 40).to_json()["tokens_per_gib"] == want
    assert {str(m): n for m, n in spec.context(meta).per_gib.items()} == want
    # the lazy modes' window costs tokens; the ladder holds the most, f16 the fewest
    assert want["ladder"] > want["q8_0"] > want["lazy"] > want["f16"] > 0


@pytest.mark.parametrize(("argv", "says"), [
    (["--gpu-layers", "most"], "“most” is neither auto nor a number"),
    (["--gpu-layers", "-1"], "-1 is below the minimum 0"),
    (["--gpu-memory", "-5"], "-5 is below the minimum 0"),
    (["--ctx", "0"], "0 is below the minimum 256"),
    (["--kv-recent", "-1"], "-1 is below the minimum 0"),
    (["--kv", "q4"], "'q4' is not one of lazy, ladder, q8_0, f16"),
    (["--rpc", "[::1]:50052"], "argument --rpc: “[::1]:50052”: llama.cpp's RPC client takes no IPv6"),
])
def test_bad_options_say_why(tiny_gguf: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                             says: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        estimate.main([str(tiny_gguf), *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_a_file_that_is_not_a_model_is_one_sentence(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    code, out, err = run(capsys, str(text))
    assert code == 1 and out == "" and err.startswith("estimate: ") and err.count("\n") == 1


def test_over_rpc_the_servers_take_the_rpc_layers_as_the_app_loads_them(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp's RPC server on 127.0.0.1 is the device: its free/total come from the engine."""
    meta = read_model_meta(smollm2_path)
    with rpc_server(tmp_path / "rpc.log") as endpoint:
        code, out, _ = run(capsys, str(smollm2_path), "--ctx", "4096", "--rpc", endpoint, "--json")
        assert code == 0
        everything = json.loads(out)
        (device,) = everything["devices"]
        assert device["name"].startswith("RPC") and 0 < device["free"] <= device["total"]
        assert everything["n_gpu_layers"] == meta.n_layer + 1  # the server has the machine's RAM
        assert everything["host"]["kv"] == 0 and device["kv"] > 0
        # as the app loads it: the servers take --rpc-layers (0: all), so a memory limit they exceed is
        # a plan that does not fit, named
        code, out, _ = run(capsys, str(smollm2_path), "--ctx", "4096", "--rpc", endpoint, "--json",
                           "--gpu-memory", "150")
        capped = json.loads(out)
        (device,) = capped["devices"]
        assert capped["n_gpu_layers"] == meta.n_layer + 1 and capped["fit"] == "red"
        assert device["weights"] + device["kv"] + device["compute"] > 150 * MiB
        code, out, _ = run(capsys, str(smollm2_path), "--ctx", "4096", "--rpc", endpoint,
                           "--rpc-layers", "11")
        assert "n_gpu_layers 11 of 31: 11 of 31 layers on the GPU, as set" in out
        assert re.search(rf"^RPC\d+ \({re.escape(endpoint)}\): weights ", out, re.M)  # numbered per process
    longest = max_ctx_per_mode(meta, available=1 << 50)
    assert all(n > 0 for n in longest.values())


def test_the_app_settings_are_the_defaults(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No option given: what the app would load (its saved settings); an option given wins."""
    settings = Settings.load()
    settings.set("kv_mode", "ladder")
    settings.set("kv_recent", 0)
    settings.set("n_ctx", 1024)
    settings.save()
    code, out, _ = run(capsys, str(tiny_gguf), "--json")
    meta = read_model_meta(tiny_gguf)
    # (the sinks stay: no recent window is their rows alone)
    sinks_only = plan(meta, 1024, "ladder", recent=DEFAULT_KV_SINKS).host.kv
    assert code == 0 and json.loads(out)["host"]["kv"] == sinks_only
    code, out, _ = run(capsys, str(tiny_gguf), "--json", "--kv-recent", "64")
    assert json.loads(out)["host"]["kv"] == plan(meta, 1024, "ladder", recent=64 + DEFAULT_KV_SINKS).host.kv


def test_help_has_every_load_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        estimate.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--ctx", "--context-budget", "--kv", "--kv-recent", "--gpu-layers", "--gpu-memory", "--rpc",
                 "--rpc-layers", "--threads", "--flash-attn"):
        assert flag in out
    assert "(default auto)" in out and f"(default {DEFAULT_KV_RECENT})" in out
