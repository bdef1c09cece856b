"""Save a conversation's KV cache as a snapshot file and resume from it, or from the transcript.

Runs on the engine's thread (it drives the EngineSession). Saving: capture the cache, write
the encrypted file under a pending name (temp file, fsync, rename inside write_snapshot),
rename it to its sha256, then point the database row at it: a crash at any step leaves the
previous snapshot or the new one, and the transcript is never touched. Opening: the header
is checked against the loaded engine before anything is decrypted, the payload is
authenticated before it reaches native code, and any refusal falls back to re-reading the
transcript, with a short note saying why.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lazykv import __version__
from lazykv.core.engine import EngineSession, KvRestoreError
from lazykv.core.fingerprint import model_sha256
from lazykv.core.keys import key_from_passphrase
from lazykv.core.snapshot import (
    ENCRYPTION_KEYRING,
    ENCRYPTION_NONE,
    ENCRYPTION_PASSPHRASE,
    FORMAT_VERSION,
    SnapshotError,
    SnapshotHeader,
    SnapshotVersionError,
    read_header,
    read_snapshot,
    write_snapshot,
)
from lazykv.core.store import Store


@dataclass
class Crypto:
    """How snapshots are protected in this session. Keys live in memory only."""

    scheme: str  # ENCRYPTION_KEYRING | ENCRYPTION_PASSPHRASE | ENCRYPTION_NONE
    key: bytes | None = None  # the keyring key
    passphrase: str = ""
    salt: bytes = b""  # the passphrase scheme's salt for new snapshots
    _derived: dict[str, bytes] = field(default_factory=dict, repr=False)

    def key_for_writing(self) -> bytes | None:
        if self.scheme == ENCRYPTION_KEYRING:
            return self.key
        if self.scheme == ENCRYPTION_PASSPHRASE:
            return self._derive(self.salt.hex())
        return None

    def key_for_reading(self, header: SnapshotHeader) -> bytes | None:
        if header.encryption == ENCRYPTION_NONE:
            return None
        if header.encryption == ENCRYPTION_KEYRING:
            if self.key is None:
                raise SnapshotError("it is encrypted with the keyring key, which is not available now")
            return self.key
        if not self.passphrase:
            raise SnapshotError("it is protected by a passphrase, which was not given in this session")
        return self._derive(header.kdf_salt)

    def _derive(self, salt_hex: str) -> bytes:
        if salt_hex not in self._derived:
            self._derived[salt_hex] = key_from_passphrase(self.passphrase, bytes.fromhex(salt_hex))
        return self._derived[salt_hex]


@dataclass(frozen=True)
class SaveResult:
    sha256: str
    size: int
    n_tokens: int
    seconds: float
    pruned: list[str]


@dataclass(frozen=True)
class OpenResult:
    how: str  # restored | rebuilt | empty
    note: str  # why it was rebuilt ("" when restored)
    n_tokens: int
    seconds: float


class Persistence:
    def __init__(self, store: Store, engine: EngineSession, crypto: Crypto, fingerprints: Path) -> None:
        self.store = store
        self.engine = engine
        self.crypto = crypto
        self._fingerprints = fingerprints
        self._model_sha: tuple[Path, str] | None = None

    def model_sha(self) -> str:
        path = self.engine.model_info().path
        if self._model_sha is None or self._model_sha[0] != path:
            self._model_sha = (path, model_sha256(path, self._fingerprints))
        return self._model_sha[1]

    def save(self, conv_id: int, budget_bytes: int = 0) -> SaveResult:
        """Snapshot the conversation's cache now; prune the least recently used ones past the budget."""
        t0 = time.perf_counter()
        kv = self.engine.capture_kv()
        layout = kv.layout
        header = SnapshotHeader(
            app_version=__version__,
            engine_version=str(layout["engine_version"]),
            model_sha256=self.model_sha(),
            n_ctx=int(layout["n_ctx"]),
            type_k=str(layout["type_k"]),
            type_v=str(layout["type_v"]),
            kv_mode=str(layout["kv_mode"]),
            lazy_phase=str(layout["lazy_phase"]),
            n_rot_k=int(layout["n_rot_k"]),
            n_rot_v=int(layout["n_rot_v"]),
            state_version=int(layout["state_version"]),
            n_tokens=len(kv.tokens),
            encryption=self.crypto.scheme,
            kdf_salt=self.crypto.salt.hex() if self.crypto.scheme == ENCRYPTION_PASSPHRASE else "",
            created=time.time(),
        )
        pending = self.store.snapshots_dir / f"pending-{uuid.uuid4().hex}.lkv"
        pending.parent.mkdir(parents=True, exist_ok=True)
        sha = write_snapshot(pending, header, kv.tokens, kv.state, self.crypto.key_for_writing())
        final = self.store.snapshot_path(sha)
        os.replace(pending, final)
        size = final.stat().st_size
        previous = self.store.set_snapshot(conv_id, sha, size, len(kv.tokens), json.dumps(asdict(header)))
        if previous and previous != sha and self.store.unreferenced(previous):
            self.store.snapshot_path(previous).unlink(missing_ok=True)
        pruned = self.store.prune_snapshots(budget_bytes) if budget_bytes > 0 else []
        return SaveResult(sha, size, len(kv.tokens), time.perf_counter() - t0, pruned)

    def open(
        self, conv_id: int, messages: Sequence[dict[str, str]], on_progress: Callable[[int, int], None]
    ) -> OpenResult:
        """Restore the conversation's snapshot, or re-read ``messages`` (the transcript) when it cannot be."""
        t0 = time.perf_counter()
        record = self.store.conversation(conv_id)
        note = "no snapshot was saved"
        if record.snapshot is not None:
            try:
                n = self._restore(record.snapshot.path, _recorded_scheme(record.snapshot.header_json))
            except (SnapshotError, KvRestoreError, OSError) as err:
                note = str(err)
            else:
                self.store.touch_snapshot(conv_id)
                return OpenResult("restored", "", n, time.perf_counter() - t0)
        if not any(m["role"] != "system" for m in messages):
            return OpenResult("empty", "", 0, time.perf_counter() - t0)
        n = self.engine.rebuild_kv(messages, on_progress)
        return OpenResult("rebuilt", note, n, time.perf_counter() - t0)

    def mismatch(self, header: SnapshotHeader) -> str | None:
        """Why a snapshot with this header cannot go into the loaded cache (None when it can)."""
        layout = self.engine.layout()
        if header.model_sha256 != self.model_sha():
            return "it was saved with another model"
        if header.state_version != layout["state_version"]:
            return (
                f"it was saved by an engine with state format {header.state_version}, "
                f"this one uses {layout['state_version']}"
            )
        if header.n_tokens > int(layout["n_ctx"]):
            return f"it holds {header.n_tokens} tokens, more than this context of {layout['n_ctx']}"
        if not _layout_fits(header, layout):
            return (
                f"it was saved with another KV cache layout (K/V {header.type_k}/{header.type_v}, "
                f"rotation {header.n_rot_k}/{header.n_rot_v}); this {layout['kv_mode']} cache stores "
                f"{layout['type_k']}/{layout['type_v']}, rotation {layout['n_rot_k']}/{layout['n_rot_v']}"
            )
        return None

    def _restore(self, path: Path, scheme: str) -> int:
        """``scheme`` is the protection recorded in the database when the snapshot was saved: a file
        whose own header claims another one (e.g. a forged unencrypted file) is refused."""
        if not path.exists():
            raise SnapshotError("its snapshot file is missing")
        try:
            header = read_header(path)
        except SnapshotVersionError as err:
            raise SnapshotError(f"it was saved by a newer LazyKV Chat (format > {FORMAT_VERSION})") from err
        if header.encryption != scheme:
            raise SnapshotError("its snapshot file is not the one saved (its protection differs)")
        reason = self.mismatch(header)
        if reason:
            raise SnapshotError(reason)
        header, tokens, state = read_snapshot(path, self.crypto.key_for_reading(header))
        self.engine.restore_kv(tokens, state)
        return len(tokens)


def _recorded_scheme(header_json: str) -> str:
    try:
        scheme = json.loads(header_json).get("encryption")
    except (ValueError, AttributeError):
        scheme = None
    return scheme if isinstance(scheme, str) else "unknown"


def _layout_fits(header: SnapshotHeader, layout: dict[str, object]) -> bool:
    """The engine's rule (llama_cpp._layout_restorable), on the header's fields."""
    saved = (header.type_k, header.type_v, header.n_rot_k, header.n_rot_v)
    now = (layout["type_k"], layout["type_v"], layout["n_rot_k"], layout["n_rot_v"])
    if saved == now:
        return True
    saved_q8 = header.type_k == header.type_v == "q8_0"
    if layout["lazy_phase"] == "f16" and saved_q8:  # a lazy cache converts first for a q8_0 state
        return (header.n_rot_k, header.n_rot_v) == (layout["lazy_rot_k"], layout["lazy_rot_v"])
    saved_f16_unrotated = header.type_k == header.type_v == "f16" and not (header.n_rot_k or header.n_rot_v)
    return saved_f16_unrotated and layout["type_k"] == layout["type_v"] == "q8_0"


def scheme_label(scheme: str) -> str:
    return {
        ENCRYPTION_KEYRING: "encrypted with a key in the OS keyring",
        ENCRYPTION_PASSPHRASE: "encrypted with your passphrase",
        ENCRYPTION_NONE: "not encrypted",
    }[scheme]
