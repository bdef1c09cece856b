"""Remote backends (llama.cpp RPC servers): host:port parsing, the settings' validation, the probe."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lazykv.core.engine.remote import (
    RPC_PROTO_VERSION,
    Unreachable,
    normalize_endpoints,
    parse_endpoint,
    parse_endpoint_text,
    probe,
    probe_all,
    unreachable_text,
)
from lazykv.core.settings import SCHEMA_VERSION, Settings
from tests.support.rpc_server import fake_rpc_server, free_port, hello_reply


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:50052", "127.0.0.1:50052"),
        ("  GPU-Box.local:1 ", "gpu-box.local:1"),
        ("localhost:65535", "localhost:65535"),
        ("my.host.example.org.:8080", "my.host.example.org.:8080"),
    ],
)
def test_valid_endpoints_are_written_one_way(text: str, expected: str) -> None:
    assert str(parse_endpoint(text)) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("127.0.0.1", "is not host:port"),
        (":50052", "is not host:port"),
        ("host:0", "port must be a number from 1 to 65535"),
        ("host:65536", "port must be a number from 1 to 65535"),
        ("host:port", "port must be a number from 1 to 65535"),
        ("host:-1", "port must be a number from 1 to 65535"),
        ("host:٣", "port must be a number from 1 to 65535"),  # a digit, but not one llama.cpp reads
        ("[::1]:50052", "takes no IPv6"),
        ("::1:50052", "takes no IPv6"),
        ("300.1.2.3:50052", "not a valid host name or IPv4 address"),
        ("10.1:50052", "not a valid host name or IPv4 address"),
        ("-bad.host:50052", "not a valid host name or IPv4 address"),
        ("under_score:50052", "not a valid host name or IPv4 address"),
        ("a..b:50052", "not a valid host name or IPv4 address"),
    ],
)
def test_invalid_endpoints_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as err:
        parse_endpoint(text)
    assert text.strip() in str(err.value)  # the sentence names the entry


def test_duplicates_are_removed_first_kept() -> None:
    assert normalize_endpoints(["b:2", "A:1", "a:1", " b:2"]) == ["b:2", "a:1"]


def test_typed_text_gives_the_valid_entries_and_a_sentence_per_bad_one() -> None:
    parsed = parse_endpoint_text("10.0.0.2:50052\n\n10.0.0.2:50052, box:1 nonsense\nbox:99999\n")
    assert parsed.endpoints == ["10.0.0.2:50052", "box:1"]
    assert len(parsed.problems) == 2
    assert "nonsense" in parsed.problems[0] and "box:99999" in parsed.problems[1]


def test_the_setting_normalizes_and_refuses(tmp_path: Path) -> None:
    settings = Settings(tmp_path / "settings.json")
    assert settings["rpc_servers"] == [] and settings["rpc_layers"] == 0
    assert settings.set("rpc_servers", ["Box:50052", "box:50052", "10.0.0.3:1"])
    assert settings["rpc_servers"] == ["box:50052", "10.0.0.3:1"]
    with pytest.raises(ValueError, match="rpc_servers: “box” is not host:port"):
        settings.set("rpc_servers", ["box"])
    with pytest.raises(ValueError, match="rpc_servers: expected a list"):
        settings.set("rpc_servers", "box:1")
    assert settings["rpc_servers"] == ["box:50052", "10.0.0.3:1"]  # a refused value changes nothing


def test_a_bad_stored_list_falls_back_and_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION,
                                "settings": {"rpc_servers": ["box:1", "box:70000"], "n_ctx": 2048}}))
    settings = Settings.load(path)
    assert settings["rpc_servers"] == [] and settings["n_ctx"] == 2048
    assert any("box:70000" in problem for problem in settings.problems)


@pytest.fixture
def rpc_like() -> Iterator[str]:
    """An endpoint that answers llama.cpp's HELLO as the engine's RPC protocol version does."""
    with fake_rpc_server(hello_reply(*RPC_PROTO_VERSION, 3)) as endpoint:
        yield endpoint


@pytest.fixture
def closed_port() -> str:
    return f"127.0.0.1:{free_port()}"


REFUSED = "nothing is listening on that port (connection refused)"


def test_probe_tells_a_server_from_a_closed_port(rpc_like: str, closed_port: str) -> None:
    assert probe(rpc_like) is None
    assert probe(closed_port) == REFUSED
    reachable, refused = probe_all([closed_port, rpc_like])
    assert reachable == [rpc_like]
    assert refused == [Unreachable(closed_port, REFUSED)]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "did not answer llama.cpp's handshake within 0.3 s: it serves another client, or it is not"),
        (b"", "closed the connection at llama.cpp's handshake"),
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "answered, but not as a llama.cpp RPC"),
        (hello_reply(RPC_PROTO_VERSION[0] + 1, 0, 0), f"protocol {RPC_PROTO_VERSION[0] + 1}.0.0, this app's"),
        (hello_reply(RPC_PROTO_VERSION[0], RPC_PROTO_VERSION[1] + 1, 0), "update one of them"),
    ],
)
def test_a_port_that_is_not_a_usable_rpc_server_is_refused(answer: bytes | None, why: str) -> None:
    """llama.cpp's client would abort the app on each of these, or wait forever on the silent one."""
    with fake_rpc_server(answer) as endpoint:
        reason = probe(endpoint, timeout=0.3)
    assert reason is not None and why in reason


def test_a_server_this_process_uses_is_not_asked_for_a_handshake() -> None:
    """It serves one client at a time, this process: the connection is all that can be checked."""
    with fake_rpc_server(None) as endpoint:
        assert probe_all([endpoint], timeout=0.3, in_use=frozenset({endpoint})) == ([endpoint], [])


def test_probe_names_an_unknown_host() -> None:
    assert probe("no-such-host.invalid:50052") == "the host name “no-such-host.invalid” is unknown"


def test_the_sentence_names_each_endpoint_and_why() -> None:
    one = unreachable_text([Unreachable("box:1", "connection refused")])
    assert one == ("The remote backend box:1 could not be used (connection refused), so the model runs "
                   "without it.")
    two = unreachable_text([Unreachable("a:1", "x"), Unreachable("b:2", "y")])
    assert two.startswith("2 remote backends could not be used") and "a:1 (x); b:2 (y)" in two
