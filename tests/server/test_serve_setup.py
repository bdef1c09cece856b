"""What ``python -m lazykv serve`` refuses before it loads anything, and how the engine stops a request."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import keyring
import pytest
from keyring.backends import fail
from pydantic import ValidationError

from lazykv.cli import serve
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import MiB
from lazykv.core.engine.types import SamplingSettings
from lazykv.core.history.snapshot import Encryption
from lazykv.core.kinds import (
    DEFAULT_KV_MODE,
    DEFAULT_KV_RECENT,
    DEFAULT_KV_SINKS,
    DEFAULT_N_CTX,
    FinishReason,
)
from lazykv.core.settings import Settings, load_spec
from lazykv.server.engine_access import Generation, Outcome, Piece, run_generation
from lazykv.server.settings import ServerSettings, is_loopback
from tests.native.rawctx import engine_threads


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.org"])
def test_a_non_loopback_address_needs_an_api_key(host: str) -> None:
    with pytest.raises(ValidationError, match="API key"):
        ServerSettings(host=host)
    assert ServerSettings(host=host, api_key="k").host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_addresses_need_no_key(host: str) -> None:
    assert is_loopback(host) and ServerSettings(host=host).api_key is None


def test_the_key_is_kept_out_of_reprs() -> None:
    assert "sekrit" not in repr(ServerSettings(api_key="sekrit"))


def test_serve_refuses_a_non_loopback_bind_without_a_key(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    assert serve.main(["--host", "0.0.0.0", "--no-api-cache"]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "--api-key" in err and "Traceback" not in err


def test_without_a_keyring_or_passphrase_it_asks_for_a_choice(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    keyring.set_keyring(fail.Keyring())
    monkeypatch.delenv(serve.PASSPHRASE_ENV, raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert serve.main(["--port", "0"]) == 2
    err = capsys.readouterr().err
    assert serve.PASSPHRASE_ENV in err and "--no-encryption" in err


def test_snapshot_protection_keyring_then_passphrase_then_none_only_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve.snapshot_crypto(False).scheme is Encryption.KEYRING  # the tests' in-memory keyring
    keyring.set_keyring(fail.Keyring())
    monkeypatch.setenv(serve.PASSPHRASE_ENV, "correct horse")
    crypto = serve.snapshot_crypto(False)
    assert crypto.scheme is Encryption.PASSPHRASE
    assert serve.snapshot_crypto(False).key_for_writing() == crypto.key_for_writing()  # unlocked again
    monkeypatch.setenv(serve.PASSPHRASE_ENV, "wrong horse")
    with pytest.raises(serve.SetupError, match="passphrase"):
        serve.snapshot_crypto(False)
    assert serve.snapshot_crypto(True).scheme is Encryption.NONE


def test_a_cancelled_generation_stops_within_one_token(smollm2_path: Path) -> None:
    session = EngineSession()
    session.load(LoadSpec(smollm2_path, n_ctx=512, kv_mode="f16", n_threads=engine_threads()))
    pieces: list[str] = []
    cancel = threading.Event()

    def emit(event: object) -> None:
        if isinstance(event, Piece):
            pieces.append(event.text)
            cancel.set()  # the client went away after the first piece

    sampling = SamplingSettings(temperature=1.0, seed=5)
    job = Generation(None, "Once upon a time", sampling, 200, [], emit, cancel)
    end = run_generation(session, None, job)
    assert isinstance(end, Outcome) and end.finish_reason is FinishReason.CANCELLED
    assert len(pieces) == 1
    assert len(session.cached_tokens()) <= end.n_prompt + 1  # at most the token being made when it stopped
    session.close()


def test_serve_says_when_its_port_is_taken(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = serve.main(["--model", str(smollm2_path), "--port", str(port), "--ctx", "512",
                           "--no-api-cache"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err
    # it said what it loaded first: the app's defaults (Auto offload: the CPU here, the window and the sinks)
    assert (f"context 512 tokens, lazy KV cache, in 16-bit the last {DEFAULT_KV_RECENT} tokens and the first "
            f"{DEFAULT_KV_SINKS}; CPU only") in err


def test_serve_help_has_the_app_s_load_options_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--ctx", "--context-budget", "--kv", "--kv-recent", "--gpu-layers", "--gpu-memory", "--rpc",
                 "--rpc-layers", "--threads", "--flash-attn"):
        assert f"{flag} " in out
    assert "(default auto)" in out and f"(default {DEFAULT_KV_RECENT})" in out
    assert f"(default {DEFAULT_N_CTX})" in out and f"(default {DEFAULT_KV_MODE})" in out


def test_serve_loads_what_the_app_would(tmp_path: Path) -> None:
    """The user's settings are serve's defaults (one LoadSpec, built in one place); options win."""
    settings = Settings.load()
    for name, value in (("kv_mode", "ladder"), ("kv_recent", 64), ("n_ctx", 1024), ("gpu_memory_mb", 512),
                        ("rpc_servers", ["127.0.0.1:50052"]), ("context_budget_mb", 32)):
        settings.set(name, value)
    settings.set("model_path", str(tmp_path / "m.gguf"))
    settings.save()
    app = load_spec(Settings.load(), tmp_path / "m.gguf")
    assert serve.served_spec(serve.build_parser().parse_args([]), Settings.load()) == app
    assert app.gpu_memory == 512 * MiB and app.context_budget == 32 * MiB and app.kv_recent == 64
    given = serve.served_spec(serve.build_parser().parse_args(["--ctx", "2048", "--gpu-layers", "7"]),
                              Settings.load())
    assert given == app.with_(n_ctx=2048, context_budget=0, gpu_layers=7)  # a length asked is not a budget
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--gpu-layers", "-1"])  # -1 is not "all": Auto is the word auto
