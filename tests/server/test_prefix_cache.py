"""The API cache on its own (no model: a stand-in session hands it tokens and state bytes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from lazykv.core.engine.types import KvLayout, KvSnapshot
from lazykv.core.history.persistence import Crypto
from lazykv.core.history.snapshot import Encryption
from lazykv.core.kinds import KvMode
from lazykv.server.prefix_cache import BLOCK, INDEX, SUFFIX, Binding, PrefixCache

BINDING = Binding(model_sha256="ab" * 32, n_ctx=4096, kv_mode="lazy", engine_version="0.3.36+lazykv.test")
LAYOUT = KvLayout(engine_version=BINDING.engine_version, n_ctx=4096, kv_mode=KvMode.LAZY, type_k="f16",
                  type_v="f16", lazy_phase="f16", lazy_rungs=("f16", "q8_0"), lazy_rot_k=0, lazy_rot_v=0,
                  n_rot_k=0, n_rot_v=0, n_rot_k_swa=0, n_rot_v_swa=0, state_version=1)


class StandIn:
    """What the cache asks of an EngineSession: its tokens, a capture, a restore."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.restored: tuple[list[int], bytes] | None = None

    def cached_tokens(self) -> list[int]:
        return list(self.tokens)

    def capture_kv(self) -> KvSnapshot:
        return KvSnapshot(LAYOUT, list(self.tokens), bytes(t % 251 for t in self.tokens) * 16)

    def restore_kv(self, tokens: list[int], state: memoryview) -> None:
        self.restored = (tokens, bytes(state))


def crypto() -> Crypto:
    return Crypto(Encryption.KEYRING, key=b"k" * 32)


def cache(tmp_path: Path, budget: int = 2**30, binding: Binding = BINDING, key: Crypto | None = None
          ) -> PrefixCache:
    return PrefixCache(tmp_path, binding, key or crypto(), budget)


def test_block_hashes_chain_every_token_before_them(tmp_path: Path) -> None:
    c = cache(tmp_path)
    tokens = list(range(4 * BLOCK))
    changed = [*tokens[: 2 * BLOCK + 5], -1, *tokens[2 * BLOCK + 6 :]]
    a, b = c.block_hashes(tokens), c.block_hashes(changed)
    assert len(a) == 4 and a[:2] == b[:2] and all(x != y for x, y in zip(a[2:], b[2:], strict=True))
    assert c.block_hashes(tokens[: BLOCK - 1]) == []


def test_the_longest_shared_prefix_is_restored_and_the_rest_is_read(tmp_path: Path) -> None:
    c = cache(tmp_path)
    conversation = list(range(1000, 1000 + 3 * BLOCK + 10))
    c.save(StandIn(conversation))
    next_turn = [*conversation, *range(7, 40)]  # the cache holds an exact prefix of it
    match = c.best(next_turn)
    assert match is not None and match.n_tokens == len(conversation)
    edited = [*conversation[: 2 * BLOCK + 3], 5, 5, 5]  # an edit inside the third block
    assert c.best(edited).n_tokens == 2 * BLOCK
    session = StandIn([])
    assert c.restore(session, c.best(next_turn))
    assert session.restored[0] == conversation
    assert c.best(list(range(BLOCK * 2))) is None  # nothing in common


def test_a_reply_adding_less_than_a_block_is_not_saved_again(tmp_path: Path) -> None:
    c = cache(tmp_path)
    tokens = list(range(2 * BLOCK))
    first = c.save(StandIn(tokens))
    assert c.save(StandIn([*tokens, *range(BLOCK - 1)])) is first
    assert len(c.entries()) == 1
    assert c.save(StandIn([*tokens, *range(BLOCK)])) is not first
    assert len(c.entries()) == 2


def test_short_caches_are_not_worth_a_file(tmp_path: Path) -> None:
    c = cache(tmp_path)
    assert c.save(StandIn(list(range(BLOCK - 1)))) is None and not c.entries()


def test_entries_survive_a_restart_and_strays_are_removed(tmp_path: Path) -> None:
    c = cache(tmp_path)
    entry = c.save(StandIn(list(range(3 * BLOCK))))
    (c.folder / f"{'0' * 64}{SUFFIX}").write_bytes(b"not in the index")
    (c.folder / f".pending-x{SUFFIX}").write_bytes(b"an unfinished save")
    packs = sorted(p.name for p in c.pieces_dir.iterdir())
    (c.pieces_dir / f"{'1' * 32}.lkvp").write_bytes(b"a pack no piece of the index is in")
    again = cache(tmp_path)
    assert [e.digest for e in again.entries()] == [entry.digest]
    wanted = [INDEX, f"{entry.digest}{SUFFIX}", "pieces"]
    assert sorted(p.name for p in again.folder.iterdir()) == sorted(wanted)
    assert sorted(p.name for p in again.pieces_dir.iterdir()) == packs and len(packs) == 1


def test_another_binding_or_key_never_sees_the_entries(tmp_path: Path) -> None:
    tokens = list(range(3 * BLOCK))
    cache(tmp_path).save(StandIn(tokens))
    other_ctx = Binding(BINDING.model_sha256, 8192, BINDING.kv_mode, BINDING.engine_version)
    assert cache(tmp_path, binding=other_ctx).best(tokens) is None  # its own folder, empty
    assert cache(tmp_path, key=Crypto(Encryption.KEYRING, key=b"x" * 32)).best(tokens) is None


def test_a_forged_index_entry_is_refused_by_the_file(tmp_path: Path) -> None:
    """The index is a hint: an entry claiming tokens its file does not hold is refused and dropped."""
    c = cache(tmp_path)
    real = c.save(StandIn(list(range(3 * BLOCK))))
    claimed = list(range(500, 500 + 3 * BLOCK))
    index = json.loads((c.folder / INDEX).read_text())
    forged = c.digest(claimed)
    index["entries"][0].update(digest=forged, blocks=c.block_hashes(claimed))
    (c.folder / INDEX).write_text(json.dumps(index))
    os.rename(c.folder / f"{real.digest}{SUFFIX}", c.folder / f"{forged}{SUFFIX}")
    fooled = cache(tmp_path)
    session = StandIn([])
    assert not fooled.restore(session, fooled.best(claimed))
    assert session.restored is None and not fooled.entries()
    assert fooled.counters.refused == 1


def test_the_least_recently_used_go_past_the_budget(tmp_path: Path) -> None:
    c = cache(tmp_path)
    c.save(StandIn(list(range(3 * BLOCK))))
    sizes = c.stats().bytes  # its file and its pieces
    c = cache(tmp_path, budget=int(sizes * 2.5))
    kept = [c.save(StandIn(list(range(n * 10_000, n * 10_000 + 3 * BLOCK)))) for n in (1, 2, 3)]
    assert {e.digest for e in c.entries()} == {kept[1].digest, kept[2].digest}
    assert c.stats().bytes <= c.stats().budget and c.counters.evicted == 2


@pytest.mark.parametrize("scheme", [Encryption.KEYRING, Encryption.NONE])
def test_files_are_the_apps_snapshot_container(tmp_path: Path, scheme: Encryption) -> None:
    c = cache(tmp_path, key=crypto() if scheme is Encryption.KEYRING else Crypto(Encryption.NONE))
    tokens = list(range(3 * BLOCK))
    entry = c.save(StandIn(tokens))
    data = (c.folder / f"{entry.digest}{SUFFIX}").read_bytes()
    assert data.startswith(b"LKVSNAP\x00")
    (pack,) = c.pieces_dir.iterdir()  # the state: the app's pieces, encrypted under the app's key
    assert pack.read_bytes().startswith(b"LKVPIECE")
    assert (bytes(t % 251 for t in tokens) in pack.read_bytes()) is (scheme is Encryption.NONE)
    assert c.restore(StandIn([]), c.best(tokens))


def test_a_file_moved_into_another_models_folder_is_refused_by_its_header(tmp_path: Path) -> None:
    """Even with its index entry copied along (same key, so the prefix hashes match), a snapshot of
    another model is not restored: its authenticated header names the other model."""
    tokens = list(range(3 * BLOCK))
    source = cache(tmp_path)
    entry = source.save(StandIn(tokens))
    other_model = Binding("cd" * 32, BINDING.n_ctx, BINDING.kv_mode, BINDING.engine_version)
    target = cache(tmp_path, binding=other_model)
    os.replace(source.folder / f"{entry.digest}{SUFFIX}", target.folder / f"{entry.digest}{SUFFIX}")
    os.replace(source.folder / INDEX, target.folder / INDEX)
    moved = cache(tmp_path, binding=other_model)
    session = StandIn([])
    assert not moved.restore(session, moved.best(tokens))
    assert session.restored is None and moved.counters.refused == 1
    assert "model_sha256" in moved.counters.last_error


class Layered(StandIn):
    """A state laid out as llama.cpp's: for each of 4 layers, a 256-byte row per cell, each row made
    from its token and position (two requests that share a prefix share each layer's leading rows)."""

    def capture_kv(self) -> KvSnapshot:
        rows = np.array(self.tokens, dtype=np.uint64)[:, None] * 1_000_003 + np.arange(len(self.tokens),
                                                                                     dtype=np.uint64)[:, None]
        layers = [(rows * (layer + 7) + np.arange(32, dtype=np.uint64)) * 0x9E3779B97F4A7C15
                  for layer in range(4)]  # fmt: skip
        return KvSnapshot(LAYOUT, list(self.tokens), b"".join(x.astype("<u8").tobytes() for x in layers))


def _requests(n: int) -> list[list[int]]:
    prefix = list(range(5000, 5000 + 30 * BLOCK))  # a long shared document
    return [[*prefix, *range(100_000 * (i + 1), 100_000 * (i + 1) + 2 * BLOCK)] for i in range(n)]


def test_requests_sharing_a_long_prefix_store_it_once_and_a_restart_reuses_it(tmp_path: Path) -> None:
    requests = _requests(4)
    alone = cache(tmp_path / "alone")
    alone.save(Layered(requests[0]))
    c = cache(tmp_path / "shared")
    for tokens in requests:
        c.save(Layered(tokens))
    assert len(c.entries()) == 4
    one = alone.stats().bytes
    assert c.stats().bytes < 1.6 * one  # four requests: about one prefix, and each one's own cells
    on_disk = sum(p.stat().st_size for p in c.folder.rglob("*") if p.is_file() and p.name != INDEX)
    assert on_disk == c.stats().bytes
    again = cache(tmp_path / "shared")  # a restart
    follow_up = [*requests[2], 7, 8, 9]
    match = again.best(follow_up)
    assert match is not None and match.n_tokens == len(requests[2])
    session = Layered([])
    assert again.restore(session, match)
    assert session.restored == (requests[2], Layered(requests[2]).capture_kv().state)


def test_a_damaged_piece_is_refused_and_the_prefix_read_again(tmp_path: Path) -> None:
    requests = _requests(2)
    c = cache(tmp_path)
    for tokens in requests:
        c.save(Layered(tokens))
    packs = sorted(c.pieces_dir.iterdir(), key=lambda p: p.stat().st_size)
    raw = bytearray(packs[-1].read_bytes())  # the first request's pack: the shared prefix
    raw[len(raw) // 3] ^= 0x10
    packs[-1].write_bytes(raw)
    session = Layered([])
    assert not c.restore(session, c.best(requests[1]))
    assert session.restored is None and c.counters.refused == 1
    assert "piece" in c.counters.last_error
    assert c.best(requests[1]) is None or c.best(requests[1]).n_tokens < len(requests[1])  # dropped
