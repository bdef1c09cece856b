"""A GGUF file's metadata, read without loading the model (stdlib only).

Used before loading: to show what a model is, to say whether a q8_0 or lazy KV cache can
work with it (and why not), and to estimate the memory a model × context × KV mode needs.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"
Q8_0_BLOCK = 32
# architectures whose memory is not an attention KV cache (recurrent state), per llama.cpp
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
NO_KV_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "t5encoder", "clip"})

# scalar value types: (struct format, size)
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # a longer metadata string means a damaged file
_MAX_COUNT = 1 << 32


class GGUFError(ValueError):
    """Not a GGUF file, or a damaged one."""


@dataclass(frozen=True)
class KvSupport:
    f16: bool
    q8_0: bool
    lazy: bool
    reason: str  # why q8_0/lazy are not possible; "" when they are

    def allows(self, kv_mode: str) -> bool:
        return {"f16": self.f16, "q8_0": self.q8_0, "lazy": self.lazy}[kv_mode]


@dataclass(frozen=True)
class ModelMeta:
    path: Path
    file_size: int
    gguf_version: int
    architecture: str
    name: str
    n_params: int
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_vocab: int
    sliding_window: int
    has_chat_template: bool

    def kv_support(self, flash_attn: bool = True) -> KvSupport:
        """Which KV cache modes can run this model, with the reason when q8_0/lazy cannot."""
        if self.architecture in RECURRENT_ARCHS:
            reason = f"{self.architecture} keeps a recurrent state, not a KV cache"
            return KvSupport(False, False, False, reason)
        if self.architecture in NO_KV_ARCHS or self.n_layer == 0:
            return KvSupport(False, False, False, f"{self.architecture} has no KV cache (not a chat model)")
        odd = [f"{n} {size}" for n, size in (("K head size", self.head_k), ("V head size", self.head_v))
               if size % Q8_0_BLOCK]
        if odd:
            return KvSupport(True, False, False,
                             f"{' and '.join(odd)} not a multiple of {Q8_0_BLOCK} (the q8_0 block)")
        if not flash_attn:
            return KvSupport(True, False, False, "a q8_0 V cache needs flash attention, which is off")
        return KvSupport(True, True, True, "")

    def kv_bytes_per_cell(self, kv_mode: str) -> float:
        """K and V bytes of one cell over all layers (a lazy cache is allocated as q8_0)."""
        elements = self.n_layer * self.n_head_kv * (self.head_k + self.head_v)
        return elements * (2.0 if kv_mode == "f16" else (2 + Q8_0_BLOCK) / Q8_0_BLOCK)

    def lazy_f16_cells(self, n_ctx: int) -> int:
        """Cells of the lazy cache's f16 view: floor(34/64 n), down to the 256-cell padding (engine rule)."""
        n = padded_ctx(n_ctx)
        cells = n * 34 // 64
        return cells // 256 * 256 if cells >= 256 else cells


def padded_ctx(n_ctx: int) -> int:
    """llama.cpp pads the KV cache to a multiple of 256 cells."""
    return max(256, math.ceil(n_ctx / 256) * 256)


def read_model_meta(path: Path | str) -> ModelMeta:
    """Read the header of a GGUF file; raise GGUFError (with the reason) if it is not one."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            return _parse(f, path, size)
    except OSError as err:
        raise GGUFError(f"cannot read {path}: {err.strerror or err}") from err
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as err:
        raise GGUFError(f"{path.name} is damaged: its GGUF header does not parse ({err})") from err


def _parse(f: BinaryIO, path: Path, size: int) -> ModelMeta:
    if f.read(4) != GGUF_MAGIC:
        raise GGUFError(f"{path.name} is not a GGUF model file (no GGUF magic)")
    (version,) = struct.unpack("<I", _read(f, 4))
    if version < 2:
        raise GGUFError(f"{path.name} is GGUF version {version}, too old for this engine")
    n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise GGUFError(f"{path.name} is damaged: implausible tensor/metadata counts")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _read_string(f)
        (vtype,) = struct.unpack("<I", _read(f, 4))
        kv[key] = _read_value(f, vtype, keep_arrays=not key.startswith("tokenizer.ggml."))
    n_params = 0
    for _ in range(n_tensors):
        _skip(f, struct.unpack("<Q", _read(f, 8))[0])  # name
        (n_dims,) = struct.unpack("<I", _read(f, 4))
        if n_dims > 8:
            raise GGUFError(f"{path.name} is damaged: a tensor with {n_dims} dimensions")
        dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims))
        _read(f, 12)  # type, offset
        n_params += math.prod(dims)
    return _meta_from(kv, path, size, version, n_params)


def _meta_from(kv: dict[str, Any], path: Path, size: int, version: int, n_params: int) -> ModelMeta:
    arch = str(kv.get("general.architecture", "unknown"))

    def num(key: str, default: int = 0) -> int:
        value = kv.get(f"{arch}.{key}", default)
        if isinstance(value, list):  # per-layer values (e.g. head_count_kv): the largest
            value = max(value, default=default)
        return int(value)

    n_embd, n_head = num("embedding_length"), num("attention.head_count")
    head_default = n_embd // n_head if n_head else 0
    vocab = kv.get("tokenizer.ggml.tokens")
    return ModelMeta(
        path=path,
        file_size=size,
        gguf_version=version,
        architecture=arch,
        name=str(kv.get("general.name", path.stem)),
        n_params=n_params,
        n_ctx_train=num("context_length"),
        n_layer=num("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=num("attention.head_count_kv", n_head),
        head_k=num("attention.key_length", head_default),
        head_v=num("attention.value_length", head_default),
        n_vocab=vocab if isinstance(vocab, int) else num("vocab_size"),
        sliding_window=num("attention.sliding_window"),
        has_chat_template="tokenizer.chat_template" in kv,
    )


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("the file ends inside its GGUF header (truncated download?)")
    return data


def _skip(f: BinaryIO, n: int) -> None:
    if n > _MAX_STRING:
        raise GGUFError("implausible string length in the GGUF header")
    f.seek(n, 1)


def _read_string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > _MAX_STRING:
        raise GGUFError("implausible string length in the GGUF header")
    return _read(f, n).decode("utf-8")


def _read_value(f: BinaryIO, vtype: int, keep_arrays: bool = True) -> Any:
    if vtype in _SCALARS:
        fmt, n = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, n))[0]
    if vtype == _STRING:
        return _read_string(f)
    if vtype == _ARRAY:
        etype, count = struct.unpack("<IQ", _read(f, 12))
        if count > _MAX_COUNT:
            raise GGUFError("implausible array length in the GGUF header")
        if etype in _SCALARS:
            fmt, n = _SCALARS[etype]
            data = _read(f, n * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", data)) if keep_arrays else count
        if etype == _STRING:
            for _ in range(count):  # skipped: tokenizer vocabularies are large; only the count is kept
                _skip(f, struct.unpack("<Q", _read(f, 8))[0])
            return count
        raise GGUFError(f"unsupported GGUF array element type {etype}")
    raise GGUFError(f"unknown GGUF value type {vtype}")
