"""The restore contract (issue 25, section 2): a restore checks the whole state before the cache
changes; a refused restore changes nothing but its destination.

Two sequences share one cache: sequence 0 holds a live conversation, states are restored into
sequence 1. A state cut short, one holding more cells than the cache can take next to sequence 0,
and one whose cell count wraps around 32 bits once the kept cells are added, are all refused; the
destination is then empty, and sequence 0's next-token logits are bit for bit those before the
restore, the phase and the rung unchanged. Before the engine checked the whole state, a lazy cache
converted itself to the rung the state needed first (sequence 0 included) and only then found the
state damaged.

Every cache kind: a lazy q8_0 cache in its f16 phase and converted, a plain q8_0 cache, the ladder
on each rung (q4_0 and q5_0); in host memory, through a state file, and on an RPC device.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp.llama import _rpc_add_server_devices

from tests.support.rpc_server import rpc_server
from tests.support.synthetic_gguf import SyntheticShape, write_llama_gguf

from .helpers import KV_TYPES, random_tokens
from .rawctx import RawContext, RawModel

N_CTX = 1024  # lazy q8_0: f16 512 / q8_0 1024; ladder q4_0: 256 / 512 / 1024; ladder q5_0: 256 / 640 / 1024
N_LIVE = 100  # sequence 0's conversation
N_DAMAGED = 700  # more than any f16 view (and the q4_0 ladder's q8_0 rung) holds: a lazy cache would convert
N_OVERSIZED = 1000  # with sequence 0's cells, more than any cache of N_CTX holds
# a plain cache's sequence state (upstream's): an 8-byte header; n_stream, rot_k, rot_v; the cell count
CELL_COUNT_OFFSET = 8 + 12


@dataclass(frozen=True)
class Kind:
    name: str
    kv: str  # key of helpers.KV_TYPES
    rung: str | None  # the lazy rung to convert to before the restore (None: as it is)


KINDS = [
    Kind("lazy-f16", "lazy", None),
    Kind("lazy-q8_0", "lazy", "q8_0"),
    Kind("q8_0", "q8_0", None),
    Kind("ladder-f16", "ladder", None),
    Kind("ladder-q8_0", "ladder", "q8_0"),
    Kind("ladder-q4_0", "ladder", "q4_0"),
    Kind("ladder-q5_0-f16", "ladder-q5", None),
    Kind("ladder-q5_0-q8_0", "ladder-q5", "q8_0"),
    Kind("ladder-q5_0-q5_0", "ladder-q5", "q5_0"),
]
DAMAGES = ["cut-short", "oversized", "count-wraps"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "synthetic-hd64.gguf"
    return write_llama_gguf(path, SyntheticShape(head_dim=64, n_head=4, n_head_kv=2))


@pytest.fixture(scope="module")
def host_model(model_file: Path) -> RawModel:
    return RawModel(model_file)


@pytest.fixture(scope="module")
def donor_states(host_model: RawModel) -> dict[str, bytes]:
    """Sequence states of a plain f16 cache (unrotated f16 rows: every cache kind reads them)."""
    states = {}
    for name, n in (("damaged", N_DAMAGED), ("oversized", N_OVERSIZED)):
        ctx = RawContext(host_model, llama_cpp.GGML_TYPE_F16, n_ctx=2048)
        ctx.decode(random_tokens(n, n), pos0=0)
        states[name] = ctx.seq_state(0)
        assert struct.unpack_from("<I", states[name], CELL_COUNT_OFFSET)[0] == n
    return states


def damaged_state(donor_states: dict[str, bytes], damage: str) -> bytes:
    if damage == "cut-short":
        return donor_states["damaged"][:-1000]
    if damage == "oversized":
        return donor_states["oversized"]
    # a cell count that, with sequence 0's N_LIVE cells added in 32 bits, wraps around to 50
    blob = bytearray(donor_states["damaged"])
    struct.pack_into("<I", blob, CELL_COUNT_OFFSET, (1 << 32) - N_LIVE + 50)
    return bytes(blob)


def live_context(model: RawModel, kind: Kind) -> tuple[RawContext, list[int]]:
    """A context of two sequences, sequence 0 holding a conversation (on the kind's rung)."""
    lazy = kind.kv in ("lazy", "ladder", "ladder-q5")
    ctx = RawContext(model, KV_TYPES[kind.kv], n_ctx=N_CTX, n_seq=2, lazy=lazy)
    tokens = random_tokens(7, N_LIVE + 1)
    ctx.decode(tokens[:N_LIVE], seq_id=0, pos0=0)
    if kind.rung is not None:
        assert ctx.convert(kind.rung) == 1
        assert ctx.lazy_info().phase == kind.rung
    return ctx, tokens


def snapshot(ctx: RawContext) -> tuple:
    """The lazy cache's phase, rung capacity, cells in use and conversions so far (() for a plain cache)."""
    info = ctx.lazy_info()
    if info.phase == "disabled":
        return ()
    return (info.phase, info.n_cells_capacity, info.n_cells_used, info.n_conversions)


def next_logits(ctx: RawContext, tokens: list[int]) -> np.ndarray:
    """Sequence 0's logits for its next token; the token is removed again afterwards."""
    logits = ctx.decode(tokens[N_LIVE:], seq_id=0, pos0=N_LIVE)
    ctx.seq_rm(0, N_LIVE, -1)
    return logits


def restore_file(ctx: RawContext, blob: bytes, seq_id: int, tmp_path: Path) -> bool:
    """The state through llama_state_seq_save_file's format: magic, version, token count, state."""
    path = tmp_path / "seq.state"
    header = struct.pack("<III", llama_cpp.LLAMA_STATE_SEQ_MAGIC, llama_cpp.LLAMA_STATE_SEQ_VERSION, 0)
    path.write_bytes(header + blob)
    tokens = (llama_cpp.llama_token * 1)()
    n_tokens = ctypes.c_size_t(0)
    n = llama_cpp.llama_state_seq_load_file(ctx.ptr, str(path).encode(), seq_id, tokens, 1,
                                            ctypes.byref(n_tokens))
    return n != 0


def check_refused(ctx: RawContext, tokens: list[int], blob: bytes, how: str, tmp_path: Path) -> None:
    before = next_logits(ctx, tokens)
    info_before = snapshot(ctx)
    ctx.decode(random_tokens(3, 5), seq_id=1, pos0=0)  # the destination holds something: it is emptied

    if how == "memory":
        ok, errors = ctx.set_seq_state(blob, 1)
        assert not ok, "a damaged state was restored"
        assert errors
    else:
        assert not restore_file(ctx, blob, 1, tmp_path), "a damaged state file was restored"

    assert ctx.pos_max(1) == -1, "the refused restore's destination is not empty"
    assert ctx.pos_max(0) == N_LIVE - 1
    llama_cpp.llama_memory_seq_rm(ctx.mem, 1, -1, -1)
    after = next_logits(ctx, tokens)
    assert np.array_equal(before.view(np.uint32), after.view(np.uint32)), (
        f"sequence 0's logits moved by up to {np.abs(before - after).max()}")
    assert snapshot(ctx) == info_before


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_refused_restore_changes_only_its_destination(
    host_model: RawModel, donor_states: dict[str, bytes], kind: Kind, damage: str, tmp_path: Path
) -> None:
    ctx, tokens = live_context(host_model, kind)
    check_refused(ctx, tokens, damaged_state(donor_states, damage), "memory", tmp_path)


@pytest.mark.parametrize("kind", [KINDS[0], KINDS[3]], ids=lambda k: k.name)
def test_refused_restore_from_a_file(
    host_model: RawModel, donor_states: dict[str, bytes], kind: Kind, tmp_path: Path
) -> None:
    ctx, tokens = live_context(host_model, kind)
    check_refused(ctx, tokens, damaged_state(donor_states, "cut-short"), "file", tmp_path)


def test_a_good_state_still_converts_and_restores(host_model: RawModel,
                                                  donor_states: dict[str, bytes]) -> None:
    """The check reads the state once more: a whole state still restores (the lazy cache converts)."""
    ctx, _ = live_context(host_model, KINDS[0])
    ok, errors = ctx.set_seq_state(donor_states["damaged"], 1)
    assert ok, errors
    assert ctx.pos_max(1) == N_DAMAGED - 1 and ctx.pos_max(0) == N_LIVE - 1
    assert ctx.lazy_info().phase == "q8_0"


# ---------------------------------------------------------------- on an RPC device


class RpcModel(RawModel):
    """The synthetic model with every layer (and so the KV cache) on the RPC device."""

    def __init__(self, path: Path, endpoint: str):
        devices = _rpc_add_server_devices(endpoint)
        params = llama_cpp.llama_model_default_params()
        self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        params.n_gpu_layers = 999
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise RuntimeError(f"cannot load {path} onto {endpoint}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.ptr))


@pytest.fixture(scope="module")
def rpc_model(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RpcModel]:
    with rpc_server(tmp_path_factory.mktemp("rpc") / "server.log") as endpoint:
        model = RpcModel(model_file, endpoint)
        yield model
        del model


@pytest.mark.parametrize("damage", ["cut-short", "count-wraps"])
@pytest.mark.parametrize("kind", [KINDS[0], KINDS[3], KINDS[4]], ids=lambda k: k.name)
def test_refused_restore_on_an_rpc_device(
    rpc_model: RpcModel, donor_states: dict[str, bytes], kind: Kind, damage: str, tmp_path: Path
) -> None:
    ctx, tokens = live_context(rpc_model, kind)
    uses = (llama_cpp.llama_memory_use * 16)()
    n = llama_cpp.llama_get_memory_use(ctx.ptr, uses, 16)
    assert any(not u.host and u.context > 0 for u in uses[:n]), "the KV cache is not on the RPC device"
    check_refused(ctx, tokens, damaged_state(donor_states, damage), "memory", tmp_path)
