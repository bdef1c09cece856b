"""A GGUF file's metadata, read without loading the model (stdlib only).

Used before loading: to show what a model is, to say whether a q8_0 or lazy KV cache can
work with it (and why not), and to estimate the memory a model × context × KV mode needs.

It is also the gate in front of llama.cpp: llama.cpp aborts the process (``GGML_ASSERT``)
on some implausible hyper-parameters, so every file is read here first, in bounded memory
and time whatever it declares, and refused with one sentence unless its header parses and
its hyper-parameters are within what a real model has.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"
Q8_0_BLOCK = 32
CTX_PADDING = 256  # llama.cpp pads the KV cache to a multiple of this many cells
# architectures whose memory is not an attention KV cache (recurrent state), per llama.cpp
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
NO_KV_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "t5encoder", "clip"})

# scalar value types: (struct format, size)
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # a longer metadata string means a damaged file
_MAX_KEY = 1 << 16
_MAX_KV = 1 << 16  # metadata entries (real models: under a hundred)
_MAX_TENSORS = 1 << 20  # tensors (real models: a few thousand)
_MAX_TENSOR_NAME = 64  # ggml's GGML_MAX_NAME
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
_MAX_KEPT_ARRAY = 4096  # per-layer arrays longer than this are only counted
_MAX_ARRAY = 1 << 22  # values of one metadata array (a vocabulary is under a million)
_MAX_KEPT_KEYS = 256  # hyper-parameter keys kept (a real model has ~20)
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset

# the engine's own limits (llama-hparams.h), beyond which it aborts instead of failing
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = frozenset({"none", "linear", "yarn", "longrope"})

# hyper-parameters read after "<architecture>.": what they are called in a sentence, and bounds
_HPARAMS: dict[str, tuple[str, int, int]] = {
    "block_count": ("{} layers", 1, LLAMA_MAX_LAYERS),
    "context_length": ("a training context of {} tokens", 1, 1 << 24),
    "embedding_length": ("an embedding length of {}", 1, 1 << 18),
    "feed_forward_length": ("a feed-forward length of {}", 0, 1 << 20),
    "attention.head_count": ("{} attention heads", 0, 4096),
    "attention.head_count_kv": ("{} KV heads", 0, 4096),
    "attention.key_length": ("a K head size of {}", 1, 4096),
    "attention.value_length": ("a V head size of {}", 1, 4096),
    "attention.sliding_window": ("a sliding window of {} tokens", 0, 1 << 24),
    "attention.sliding_window_pattern": ("a sliding-window pattern of {} layers", 0, 1 << 16),
    "vocab_size": ("a vocabulary of {} tokens", 1, 1 << 22),
    "expert_count": ("{} experts", 0, LLAMA_MAX_EXPERTS),
    "expert_used_count": ("{} experts used per token", 0, LLAMA_MAX_EXPERTS),
    "expert_group_count": ("{} expert groups", 0, LLAMA_MAX_EXPERTS),
    "expert_group_used_count": ("{} expert groups used", 0, LLAMA_MAX_EXPERTS),
    "nextn_predict_layers": ("{} next-token prediction layers", 0, LLAMA_MAX_LAYERS),
    "rope.dimension_count": ("a RoPE dimension count of {}", 0, 4096),
}
_PER_LAYER = frozenset({"feed_forward_length", "attention.head_count", "attention.head_count_kv",
                        "expert_used_count"})
_MAX_KEPT_STRING = 256  # bytes kept of a string value (general.name, rope.scaling.type, ...)
_MAX_VOCAB = 1 << 22
_DEFAULT_ALIGNMENT = 32
# ggml tensor types: (elements per block, bytes per block); a test checks it against the engine's ggml
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
    42: (64, 18),
}


class GGUFError(ValueError):
    """Not a usable GGUF model file.

    ``str(err)`` is one sentence for the user; ``details`` says exactly what was wrong (also a note
    of the exception, so tracebacks show it).
    """

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details or message
        self.add_note(self.details)


class ImplausibleModelError(GGUFError):
    """A GGUF file that parses but declares hyper-parameters no real model has (crafted or corrupt)."""


# a file cut short (an interrupted download): said as such, the offsets in the details
_INCOMPLETE = ("is incomplete: the file ends before the model does, as after an interrupted download; "
               "download it again")


class _Damaged(Exception):
    """Raised while parsing: ``reason`` ends "<file> is damaged: ..." (or "<file> ..." if not ``damaged``)."""

    def __init__(self, reason: str, details: str = "", damaged: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.details, self.damaged = reason, details or reason, damaged


class _Implausible(Exception):
    """Raised while validating: ``what`` completes "<file> is not a usable model: it declares ..."."""

    def __init__(self, what: str, details: str) -> None:
        super().__init__(what)
        self.what, self.details = what, details


@dataclass(frozen=True)
class KvSupport:
    f16: bool
    q8_0: bool
    lazy: bool
    reason: str  # why q8_0/lazy/ladder are not possible; "" when they are (the ladder needs what lazy does)

    def allows(self, kv_mode: str) -> bool:
        return {"f16": self.f16, "q8_0": self.q8_0, "lazy": self.lazy, "ladder": self.lazy}[kv_mode]


# tensor types the CPU backend repacks into its own buffer (CPU_REPACK) for its matrix kernels, on x86-64
# with AVX2 (the engine's baseline), when the matrix has a multiple of 8 rows: Q4_0, Q4_K, IQ4_NL, MXFP4
REPACKED_TYPES = frozenset({2, 12, 20, 39})


@dataclass(frozen=True)
class TensorGroup:
    """Tensors llama.cpp places together: their bytes, and where they lie in the file's tensor data."""

    nbytes: int = 0
    repack: int = 0  # of nbytes, what the CPU backend repacks (a second copy, when in host memory)
    start: int = 0  # offset of the first byte in the tensor data
    end: int = 0  # one past the last byte
    largest: int = 0  # the largest tensor's bytes (what a device copies in to run a product with it)

    def add(self, offset: int, nbytes: int, repack: int) -> TensorGroup:
        if not self.nbytes and not self.end:
            return TensorGroup(nbytes, repack, offset, offset + nbytes, nbytes)
        return TensorGroup(self.nbytes + nbytes, self.repack + repack, min(self.start, offset),
                           max(self.end, offset + nbytes), max(self.largest, nbytes))


@dataclass(frozen=True)
class TensorBytes:
    """The model's tensors by where llama.cpp places them: the input layer (token embeddings, always in host
    memory), each repeating layer ``blk.N`` (on a device when offloaded), the output layer (output norm and
    matrix: on a device whenever any layer is), anything else (host memory). ``tied``: no output matrix of
    its own; the output reuses the token embeddings, which llama.cpp then also loads with the output layer."""

    token_embd: TensorGroup
    layers: tuple[TensorGroup, ...]  # by layer index
    output: TensorGroup
    other: TensorGroup
    tied: bool

    @property
    def total(self) -> int:
        layers = sum(g.nbytes for g in self.layers)
        return self.token_embd.nbytes + layers + self.output.nbytes + self.other.nbytes


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
    file_type: int = -1  # general.file_type (llama_ftype: the weights' quantization); -1 when absent
    tensors: TensorBytes | None = None  # None: not read (metadata built by hand)
    n_ff: int = 0  # feed-forward length (the largest layer's)
    swa_layers: int = 0  # layers that attend through the sliding window (their cache: the window and a batch)
    swa_pattern: tuple[bool, ...] = ()  # per layer, whether it is one of them (() where not read: swa_flags)

    def swa_flags(self) -> list[bool]:
        """Per repeating layer, whether it attends through the sliding window: the pattern read from the
        file, else (metadata built or changed by hand) ``swa_layers`` of them with the global ones spread
        evenly."""
        n_layer = max(0, self.n_layer)
        if len(self.swa_pattern) == n_layer and sum(self.swa_pattern) == self.swa_layers:
            return list(self.swa_pattern)
        n_global = n_layer - min(max(0, self.swa_layers), n_layer)
        return [(il + 1) * n_global // n_layer == il * n_global // n_layer for il in range(n_layer)]

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

    def lazy_f16_cells(self, n_ctx: int) -> int:
        """Cells of the lazy cache's f16 view: floor(34/64 n), down to the 256-cell padding (engine rule)."""
        n = padded_ctx(n_ctx)
        cells = n * 34 // 64
        return cells // CTX_PADDING * CTX_PADDING if cells >= CTX_PADDING else cells


def padded_ctx(n_ctx: int) -> int:
    """llama.cpp pads the KV cache to a multiple of 256 cells."""
    return max(CTX_PADDING, -(-n_ctx // CTX_PADDING) * CTX_PADDING)


def read_model_meta(path: Path | str) -> ModelMeta:
    """Read and check the header of a GGUF file; raise GGUFError (one sentence, ``details``) if unusable.

    Memory stays bounded whatever the file declares: only the few values used here are kept.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            return read_model_meta_from(f, size, path)
    except OSError as err:
        raise GGUFError(f"Cannot read {path}: {err.strerror or err}.", repr(err)) from err


def read_model_meta_from(f: BinaryIO, size: int, path: Path) -> ModelMeta:
    """``read_model_meta`` of a file already open (or any seekable reader, e.g. one over HTTP range
    requests) that is ``size`` bytes long; ``path`` names it in sentences."""
    try:
        kv, version, (n_params, tensors) = _parse(_Reader(f, size))
    except _Damaged as err:
        sentence = f"{path.name} is damaged: {err.reason}." if err.damaged else f"{path.name} {err.reason}."
        raise GGUFError(sentence, err.details) from None
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as err:
        raise GGUFError(f"{path.name} is damaged: its GGUF header does not parse.", repr(err)) from err
    try:
        return _meta_from(kv, path, size, version, n_params, tensors)
    except _Implausible as err:
        raise ImplausibleModelError(f"{path.name} is not a usable model: it declares {err.what}.",
                                    err.details) from None


class _Reader:
    """Reads a GGUF header, refusing any length that reaches past the end of the file."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def left(self) -> int:
        return self.size - self.f.tell()

    def read(self, n: int) -> bytes:
        data = self.f.read(n) if n <= self.left() else b""
        if len(data) != n:
            raise _Damaged(_INCOMPLETE, f"truncated: needed {n} bytes at offset {self.f.tell()} of "
                           f"{self.size}, inside the GGUF header", damaged=False)
        return data

    def skip(self, n: int) -> None:
        if n > self.left():
            raise _Damaged(_INCOMPLETE, f"truncated: skipping {n} bytes at offset {self.f.tell()} of "
                           f"{self.size}, inside the GGUF header", damaged=False)
        self.f.seek(n, 1)

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))

    def length(self, limit: int, what: str) -> int:
        (n,) = self.unpack("<Q")
        if n > limit:
            raise _Damaged(f"it holds a {what} of {n} bytes", f"{what} length {n} > {limit}")
        return n

    def string(self, limit: int = _MAX_STRING, what: str = "metadata string") -> str:
        return self.read(self.length(limit, what)).decode("utf-8")

    def string_head(self, keep: int) -> str:
        """A metadata string's first ``keep`` bytes (the rest is skipped, never held)."""
        n = self.length(_MAX_STRING, "metadata string")
        head = self.read(min(n, keep))
        self.skip(n - len(head))
        return head.decode("utf-8", errors="replace")


def _parse(r: _Reader) -> tuple[dict[str, Any], int, tuple[int, TensorBytes]]:
    head = r.read(4)
    if head != GGUF_MAGIC:
        raise _Damaged("is not a GGUF model file",
                       f"it starts with {head!r}, not the GGUF magic {GGUF_MAGIC!r}", damaged=False)
    (version,) = r.unpack("<I")
    if not 2 <= version <= 3:
        raise _Damaged(f"is GGUF version {version}; this engine reads versions 2 and 3", damaged=False)
    n_tensors, n_kv = r.unpack("<QQ")
    _check_count(n_kv, _MAX_KV, _MIN_KV_BYTES, r.left(), "metadata entries")
    _check_count(n_tensors, _MAX_TENSORS, _MIN_TENSOR_BYTES, r.left(), "tensors")
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string(_MAX_KEY, "metadata key")
        (vtype,) = r.unpack("<I")
        value = _read_value(r, vtype, _wanted(key))
        if value is not _SKIPPED:
            if key not in kv and len(kv) >= _MAX_KEPT_KEYS:
                raise _Damaged("it holds implausibly many hyper-parameters",
                               f"over {_MAX_KEPT_KEYS} kept keys")
            kv[key] = value
    return kv, version, _read_tensor_infos(r, n_tensors, _alignment(kv))


def _alignment(kv: dict[str, Any]) -> int:
    value = kv.get("general.alignment")
    if value is None:
        return _DEFAULT_ALIGNMENT
    if not isinstance(value, _Scalar) or value.vtype not in _INTEGERS or value.value <= 0 \
            or value.value & (value.value - 1):
        raise _Damaged("its tensor alignment is not a power of two",
                       f"general.alignment = {getattr(value, 'value', value)!r}")
    return int(value.value)


def _check_count(n: int, limit: int, min_bytes: int, left: int, what: str) -> None:
    details = f"{n} {what}: at most {limit}, and {left} bytes left hold at most {left // min_bytes}"
    if n > limit:
        raise _Damaged(f"its GGUF header declares {n} {what}", details)
    if n * min_bytes > left:
        raise _Damaged(_INCOMPLETE, f"truncated: the file ends before the {n} {what} its header "
                       f"declares; {details}", damaged=False)


def _read_tensor_infos(r: _Reader, n_tensors: int, alignment: int) -> tuple[int, TensorBytes]:
    """The parameter count and the tensor bytes per place; refuses a file too short for the tensor data its
    header declares."""
    n_params, data_end = 0, 0
    embd = output = other = TensorGroup()
    has_output = False
    layers: dict[int, TensorGroup] = {}
    for _ in range(n_tensors):
        name = _tensor_name(r)
        (n_dims,) = r.unpack("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _Damaged(f"a tensor has {n_dims} dimensions", f"n_dims {n_dims} not in 1..{_MAX_DIMS}")
        dims = r.unpack(f"<{n_dims}Q")
        ttype, offset = r.unpack("<IQ")
        n = math.prod(dims)
        if n >= 1 << 63:
            raise _Damaged("a tensor has more elements than a file can hold", f"dims {dims}")
        n_params += n
        nbytes = 0
        if ttype in GGML_BLOCKS:
            block, size = GGML_BLOCKS[ttype]
            nbytes = -(-n // block) * size
            data_end = max(data_end, offset + nbytes)
        repack = nbytes if ttype in REPACKED_TYPES and n_dims == 2 and dims[1] % 8 == 0 else 0
        layer = _layer_index(name)
        if layer is not None:
            layers[layer] = layers.get(layer, TensorGroup()).add(offset, nbytes, repack)
        elif name.startswith("token_embd."):
            embd = embd.add(offset, nbytes, 0)  # read by row (GET_ROWS): never repacked
        elif name.startswith(("output.", "output_norm.")):
            output = output.add(offset, nbytes, repack)
            has_output = has_output or name == "output.weight"
        else:
            other = other.add(offset, nbytes, 0)
    data_start = -(-r.f.tell() // alignment) * alignment
    if data_start + data_end > r.size:
        raise _Damaged(_INCOMPLETE, f"truncated: the tensor data needs {data_start + data_end} bytes, "
                       f"the file has {r.size}", damaged=False)
    n_layers = max(layers) + 1 if layers else 0
    per_layer = tuple(layers.get(i, TensorGroup()) for i in range(n_layers))
    return n_params, TensorBytes(embd, per_layer, output, other, tied=not has_output)


def _tensor_name(r: _Reader) -> str:
    return r.read(r.length(_MAX_TENSOR_NAME, "tensor name")).decode("utf-8", errors="replace")


def _layer_index(name: str) -> int | None:
    """N of a ``blk.N.`` tensor (N below the engine's layer limit), else None."""
    if not name.startswith("blk."):
        return None
    index, dot, _ = name[4:].partition(".")
    if not dot or not index.isdigit() or len(index) > 3 or int(index) >= LLAMA_MAX_LAYERS:
        return None
    return int(index)


_SKIPPED = object()


@dataclass(frozen=True)
class _Scalar:
    vtype: int
    value: Any


@dataclass(frozen=True)
class _Array:
    """A metadata array as kept: element type, length, and min/max when short and numeric."""

    etype: int
    count: int
    low: Any = None
    high: Any = None


def _wanted(key: str) -> str:
    """How a key's value is kept: "value" (scalars), "array" (min/max too), "count", or "" (skipped)."""
    if key in ("general.architecture", "general.name", "general.alignment", "general.file_type",
               "tokenizer.chat_template"):
        return "value"
    if key == "tokenizer.ggml.tokens":
        return "count"
    suffix = key.partition(".")[2]
    if suffix in _HPARAMS or suffix == "rope.scaling.type":
        return "array"
    return ""


def _read_value(r: _Reader, vtype: int, keep: str) -> Any:
    if vtype in _SCALARS:
        fmt, n = _SCALARS[vtype]
        if not keep:
            r.skip(n)
            return _SKIPPED
        return _Scalar(vtype, struct.unpack(fmt, r.read(n))[0])
    if vtype == _STRING:
        if keep in ("value", "array"):
            return _Scalar(vtype, r.string_head(_MAX_KEPT_STRING))
        r.skip(r.length(_MAX_STRING, "metadata string"))
        return _SKIPPED
    if vtype == _ARRAY:
        etype, count = r.unpack("<IQ")
        return _read_array(r, etype, count, keep)
    raise _Damaged(f"it holds a metadata value of unknown type {vtype}", f"value type {vtype}")


def _read_array(r: _Reader, etype: int, count: int, keep: str) -> Any:
    if count > _MAX_ARRAY:  # the engine would hold it in memory, and take seconds to read it
        raise _Damaged(f"it holds a metadata array of {count} values", f"{count} > {_MAX_ARRAY}")
    if etype in _SCALARS:
        size = _SCALARS[etype][1]
        if count > r.left() // size:
            raise _Damaged(f"it holds an array of {count} values",
                           f"{count} × {size} bytes > {r.left()} left")
        if keep == "array" and count <= _MAX_KEPT_ARRAY and etype in _INTEGERS:
            values = struct.unpack(f"<{count}{_SCALARS[etype][0][1]}", r.read(size * count))
            return _Array(etype, count, min(values, default=None), max(values, default=None))
        r.skip(size * count)
    elif etype == _STRING:
        if count > r.left() // 8:
            raise _Damaged(f"it holds an array of {count} strings", f"{count} strings, {r.left()} bytes left")
        for _ in range(count):  # tokenizer vocabularies are large: only the count is kept
            r.skip(r.length(_MAX_STRING, "metadata string"))
    else:
        raise _Damaged(f"it holds an array of unknown element type {etype}", f"array element type {etype}")
    return _Array(etype, count) if keep else _SKIPPED


def _meta_from(kv: dict[str, Any], path: Path, size: int, version: int, n_params: int,
               tensors: TensorBytes | None = None) -> ModelMeta:
    arch_value = kv.get("general.architecture")
    if arch_value is not None and arch_value.vtype != _STRING:
        raise _Implausible("an architecture that is not a name",
                           f"general.architecture has type {arch_value.vtype}")
    arch = arch_value.value if arch_value is not None else "unknown"
    num = _hparam_reader(kv, arch)
    n_layer = num("block_count")
    n_embd, n_head = num("embedding_length"), num("attention.head_count")
    n_head_kv = num("attention.head_count_kv", n_head)
    _check_relations(kv, arch, num, n_layer, n_head, n_head_kv)
    head_default = n_embd // n_head if n_head else 0
    swa = _swa_layers(kv, arch, num, n_layer)
    vocab = kv.get("tokenizer.ggml.tokens")
    n_vocab = vocab.count if isinstance(vocab, _Array) else num("vocab_size")
    if n_vocab > _MAX_VOCAB:
        raise _Implausible(f"a vocabulary of {n_vocab} tokens",
                           f"tokenizer.ggml.tokens: {n_vocab} > {_MAX_VOCAB}")
    name = kv.get("general.name")
    return ModelMeta(
        path=path,
        file_size=size,
        gguf_version=version,
        architecture=arch,
        name=str(name.value) if isinstance(name, _Scalar) else path.stem,
        n_params=n_params,
        n_ctx_train=num("context_length"),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_k=num("attention.key_length", head_default),
        head_v=num("attention.value_length", head_default),
        n_vocab=n_vocab,
        sliding_window=num("attention.sliding_window"),
        has_chat_template="tokenizer.chat_template" in kv,
        file_type=_file_type(kv.get("general.file_type")),
        tensors=tensors,
        n_ff=num("feed_forward_length"),
        swa_layers=sum(swa),
        swa_pattern=tuple(swa),
    )


# llama.cpp's sliding-window pattern per architecture (its models' load_swa_pattern): of every n layers
# one attends globally, the last (the first where dense_first); a GGUF may give its own n
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "exaone4": (4, False), "exaone-moe": (4, False),
    "olmo2": (4, False), "gpt-oss": (2, False), "llama4": (4, False), "afmoe": (4, False),
}


def _swa_layers(kv: dict[str, Any], arch: str, num: Callable[..., int], n_layer: int) -> list[bool]:
    """Per layer, whether it attends through the sliding window; none where the model has no window, or
    where its pattern is not known here (then every layer is counted at the full context: never too
    little)."""
    none = [False] * max(0, n_layer)
    if num("attention.sliding_window") <= 0 or arch not in SWA_PATTERNS:
        return none
    n, dense_first = SWA_PATTERNS[arch]
    if isinstance(kv.get(f"{arch}.attention.sliding_window_pattern"), _Scalar):
        n = num("attention.sliding_window_pattern")
    elif f"{arch}.attention.sliding_window_pattern" in kv:  # a per-layer array: not read here
        return none
    if n == 0:
        return [True] * max(0, n_layer)
    if dense_first:
        return [il % n != 0 for il in range(n_layer)]
    return [il % n < n - 1 for il in range(n_layer)]


def _file_type(value: Any) -> int:
    """general.file_type as a whole number, -1 when absent or not one (it only names the quantization)."""
    if isinstance(value, _Scalar) and value.vtype in _INTEGERS and 0 <= value.value < 1 << 16:
        return int(value.value)
    return -1


def _hparam_reader(kv: dict[str, Any], arch: str) -> Callable[..., int]:
    """``num(key, default)``: the checked whole number of ``<arch>.<key>`` (per-layer arrays: the largest)."""

    def num(key: str, default: int = 0) -> int:
        label, low, high = _HPARAMS[key]
        full = f"{arch}.{key}"
        value = kv.get(full)
        if value is None:
            return default
        if isinstance(value, _Array):
            if key not in _PER_LAYER or value.etype not in _INTEGERS:
                raise _Implausible(f"a list where {full} takes one value", f"{full} is an array")
            if value.high is None:
                raise _Implausible(f"per-layer values for {value.count} layers",
                                   f"{full}: {value.count} values")
            values = (value.low, value.high)
        elif value.vtype in _INTEGERS:
            values = (value.value,)
        else:
            shown = repr(value.value)[:40]
            raise _Implausible(f"{label.format(shown)}, which is not a whole number",
                               f"{full} = {shown} (GGUF type {value.vtype})")
        for v in values:
            if not low <= v <= high:
                raise _Implausible(label.format(v), f"{full} = {v}, plausible: {low}..{high}")
        return max(values)

    return num


def _check_relations(kv: dict[str, Any], arch: str, num: Callable[..., int],
                     n_layer: int, n_head: int, n_head_kv: int) -> None:
    """The cross-checks llama.cpp asserts (aborting) rather than reports, plus per-layer array lengths."""
    for key in _PER_LAYER:
        value = kv.get(f"{arch}.{key}")
        if isinstance(value, _Array) and value.count != n_layer:
            raise _Implausible(f"{n_layer} layers but {key} values for {value.count}",
                               f"{arch}.{key} has {value.count} values, block_count is {n_layer}")
    if n_head_kv > n_head:
        raise _Implausible(f"{n_head_kv} KV heads for {n_head} attention heads",
                           f"{arch}.attention.head_count_kv {n_head_kv} > head_count {n_head}")
    if num("nextn_predict_layers") > n_layer:
        raise _Implausible(f"more next-token prediction layers than its {n_layer} layers",
                           f"{arch}.nextn_predict_layers > block_count {n_layer}")
    _check_experts(arch, num("expert_count"), num("expert_used_count"),
                   num("expert_group_count"), num("expert_group_used_count"))
    scaling = kv.get(f"{arch}.rope.scaling.type")
    if scaling is not None and (not isinstance(scaling, _Scalar) or scaling.value not in ROPE_SCALING_TYPES):
        shown = repr(getattr(scaling, "value", "a list"))[:40]
        raise _Implausible(f"an unknown RoPE scaling type {shown}",
                           f"{arch}.rope.scaling.type = {shown}; known: {sorted(ROPE_SCALING_TYPES)}")


def _check_experts(arch: str, n_expert: int, n_used: int, n_groups: int, n_groups_used: int) -> None:
    """llama.cpp's load_hparams asserts on the expert counts; refuse what it would abort on."""
    details = (f"{arch}: expert_count {n_expert}, expert_used_count {n_used}, "
               f"expert_group_count {n_groups}, expert_group_used_count {n_groups_used}")
    if n_used > n_expert:
        raise _Implausible(f"{n_used} experts used per token of {n_expert} experts", details)
    if n_expert == 0:
        if n_groups:
            raise _Implausible(f"{n_groups} expert groups without experts", details)
        return
    if n_used == 0:
        raise _Implausible(f"{n_expert} experts of which none is used", details)
    if n_groups >= n_expert:
        raise _Implausible(f"{n_groups} expert groups for {n_expert} experts", details)
    if n_groups > 1 and (n_expert % n_groups or not 0 < n_groups_used < n_groups):
        raise _Implausible(f"{n_groups} expert groups that do not fit its {n_expert} experts", details)
