"""A corpus of crafted GGUF files: damaged, truncated, absurd, or just within bounds.

Written byte by byte (the ``gguf`` package refuses to write most of these): a tiny llama
model that loads, then one file per way a file can lie about itself. Each case says what
must happen to it: refused (with the words the refusal must contain) or loaded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
            U64: "Q", I64: "q", F64: "d"}
ALIGNMENT = 32
ARCH = "llama"


@dataclass
class Kv:
    key: str
    vtype: int
    value: Any  # a scalar, a str, or (element type, list) for arrays
    raw: bytes | None = None  # written instead of the encoded value (after the type)


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]  # ggml order: ne0 first
    ttype: int  # 0 f32, 1 f16
    data: bytes


@dataclass
class Spec:
    """A GGUF file to write; the count/version fields can lie about what follows."""

    kvs: list[Kv]
    tensors: list[Tensor]
    magic: bytes = b"GGUF"
    version: int = 3
    n_kv: int | None = None
    n_tensors: int | None = None


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value: Any) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        etype, items = value
        body = b"".join(_value(etype, v) for v in items) if etype in (STRING, ARRAY) \
            else struct.pack(f"<{len(items)}{_FORMATS[etype]}", *items)
        return struct.pack("<IQ", etype, len(items)) + body
    return struct.pack("<" + _FORMATS[vtype], value)


def gguf_bytes(spec: Spec) -> bytes:
    out = bytearray(spec.magic + struct.pack("<I", spec.version))
    out += struct.pack("<QQ", len(spec.tensors) if spec.n_tensors is None else spec.n_tensors,
                       len(spec.kvs) if spec.n_kv is None else spec.n_kv)
    for kv in spec.kvs:
        out += _string(kv.key) + struct.pack("<I", kv.vtype)
        out += kv.raw if kv.raw is not None else _value(kv.vtype, kv.value)
    offset, data = 0, bytearray()
    for t in spec.tensors:
        out += _string(t.name) + struct.pack("<I", len(t.dims)) + struct.pack(f"<{len(t.dims)}Q", *t.dims)
        out += struct.pack("<IQ", t.ttype, offset)
        padded = t.data + bytes(-len(t.data) % ALIGNMENT)
        data += padded
        offset += len(padded)
    out += bytes(-len(out) % ALIGNMENT)
    return bytes(out + data)


# a tiny llama that llama.cpp loads: 2 layers, 2 heads of 32, 1 KV head, 256 tokens ("none" vocab)
N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB = 2, 2, 1, 32, 128, 256
N_EMBD = N_HEAD * HEAD_DIM


def base_kvs() -> list[Kv]:
    p = ARCH + "."
    return [
        Kv("general.architecture", STRING, ARCH),
        Kv("general.name", STRING, "crafted"),
        Kv(p + "context_length", U32, 512),
        Kv(p + "embedding_length", U32, N_EMBD),
        Kv(p + "block_count", U32, N_LAYER),
        Kv(p + "feed_forward_length", U32, N_FF),
        Kv(p + "attention.head_count", U32, N_HEAD),
        Kv(p + "attention.head_count_kv", U32, N_HEAD_KV),
        Kv(p + "attention.key_length", U32, HEAD_DIM),
        Kv(p + "attention.value_length", U32, HEAD_DIM),
        Kv(p + "rope.dimension_count", U32, HEAD_DIM),
        Kv(p + "attention.layer_norm_rms_epsilon", F32, 1e-5),
        Kv(p + "vocab_size", U32, N_VOCAB),
        Kv("tokenizer.ggml.model", STRING, "none"),
        Kv("general.file_type", U32, 1),
    ]


def base_tensors(seed: int = 0) -> list[Tensor]:
    rng = np.random.default_rng(seed)

    def mat(name: str, rows: int, cols: int) -> Tensor:
        w = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)
        return Tensor(name, (cols, rows), 1, w.tobytes())

    def ones(name: str, n: int) -> Tensor:
        return Tensor(name, (n,), 0, np.ones(n, np.float32).tobytes())

    n_kv = N_HEAD_KV * HEAD_DIM
    tensors = [mat("token_embd.weight", N_VOCAB, N_EMBD)]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        tensors += [ones(b + "attn_norm.weight", N_EMBD), mat(b + "attn_q.weight", N_EMBD, N_EMBD),
                    mat(b + "attn_k.weight", n_kv, N_EMBD), mat(b + "attn_v.weight", n_kv, N_EMBD),
                    mat(b + "attn_output.weight", N_EMBD, N_EMBD), ones(b + "ffn_norm.weight", N_EMBD),
                    mat(b + "ffn_gate.weight", N_FF, N_EMBD), mat(b + "ffn_up.weight", N_FF, N_EMBD),
                    mat(b + "ffn_down.weight", N_EMBD, N_FF)]
    return [*tensors, ones("output_norm.weight", N_EMBD), mat("output.weight", N_VOCAB, N_EMBD)]


def base_spec() -> Spec:
    return Spec(base_kvs(), base_tensors())


def with_kv(key: str, vtype: int, value: Any = None, raw: bytes | None = None) -> Spec:
    """The base model with ``key`` replaced (or added) by this value."""
    spec = base_spec()
    kvs = [kv for kv in spec.kvs if kv.key != key]
    spec.kvs = [*kvs, Kv(key, vtype, value, raw)]
    return spec


def header_size(spec: Spec) -> int:
    """Bytes before the tensor data (header, metadata, tensor infos, padding)."""
    return len(gguf_bytes(spec)) - sum(len(t.data) + (-len(t.data) % ALIGNMENT) for t in spec.tensors)


def kv_end(spec: Spec) -> int:
    """Bytes of magic, version, counts and metadata: where the tensor infos begin."""
    return len(gguf_bytes(Spec(spec.kvs, [], spec.magic, spec.version, spec.n_kv, 0)))


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # the outcome class the summary counts: which way the file lies
    build: Callable[[], bytes]
    refusal: str | None  # words the refusal must contain; None: the file must load


def _spec(spec_fn: Callable[[], Spec]) -> Callable[[], bytes]:
    return lambda: gguf_bytes(spec_fn())


def _cut(at: Callable[[bytes], int]) -> Callable[[], bytes]:
    def build() -> bytes:
        data = gguf_bytes(base_spec())
        return data[:at(data)]
    return build


def _huge_key_length() -> bytes:
    """A first metadata key claiming 2^62 bytes."""
    data = gguf_bytes(base_spec())
    return data[:16] + struct.pack("<Q", len(base_kvs()) + 1) + struct.pack("<Q", 1 << 62) + data[24:]


def _array_spec(etype: int, count: int, size: int) -> Callable[[], Spec]:
    """The base model with a metadata array of ``count`` zero values of ``size`` bytes."""
    def spec() -> Spec:
        base = base_spec()
        base.kvs.append(Kv("general.crafted_blob", ARRAY, None, raw=struct.pack("<IQ", etype, count)
                           + bytes(count * size)))
        return base
    return spec


def _p(key: str) -> str:
    return f"{ARCH}.{key}"


CASES: list[Case] = [
    Case("control", "loads", _spec(base_spec), None),
    Case("million-value-metadata-array", "loads", _spec(_array_spec(U32, 1 << 20, 4)), None),
    Case("per-layer-head-counts", "loads",
         _spec(lambda: with_kv(_p("attention.head_count_kv"), ARRAY, (U32, [N_HEAD_KV] * N_LAYER))), None),
    # not GGUF / wrong version
    Case("bad-magic", "not-gguf", _spec(lambda: Spec(base_kvs(), base_tensors(), magic=b"GGML")),
         "not a GGUF model file"),
    Case("magic-only", "truncated", _cut(lambda d: 4), "is incomplete"),
    Case("version-1", "not-gguf", _spec(lambda: Spec(base_kvs(), base_tensors(), version=1)),
         "GGUF version 1"),
    Case("version-99", "not-gguf", _spec(lambda: Spec(base_kvs(), base_tensors(), version=99)),
         "GGUF version 99"),
    # truncations
    Case("cut-in-counts", "truncated", _cut(lambda d: 12), "is incomplete"),
    Case("cut-in-metadata", "truncated", _cut(lambda d: kv_end(base_spec()) // 2), "is incomplete"),
    Case("cut-in-tensor-infos", "truncated", _cut(lambda d: kv_end(base_spec()) + 40), "is incomplete"),
    Case("cut-in-tensor-data", "truncated", _cut(lambda d: header_size(base_spec()) + 1000), "is incomplete"),
    Case("cut-last-byte", "truncated", _cut(lambda d: len(d) - 1), "is incomplete"),
    # huge counts and lengths
    Case("huge-kv-count", "huge-count", _spec(lambda: Spec(base_kvs(), base_tensors(), n_kv=1 << 62)),
         "metadata entries"),
    Case("huge-tensor-count", "huge-count",
         _spec(lambda: Spec(base_kvs(), base_tensors(), n_tensors=1 << 40)), "tensors"),
    Case("huge-key-length", "huge-length", _huge_key_length, "metadata key"),
    Case("huge-string-length", "huge-length",
         _spec(lambda: with_kv("general.name", STRING, raw=struct.pack("<Q", 1 << 62))), "metadata string"),
    Case("huge-array-count", "huge-length",
         _spec(lambda: with_kv("general.junk", ARRAY, raw=struct.pack("<IQ", U32, 1 << 61))), "array of"),
    Case("64-MiB-metadata-array", "huge-length", _spec(_array_spec(U8, 64 << 20, 1)), "array of 67108864"),
    Case("huge-string-array-count", "huge-length",
         _spec(lambda: with_kv("tokenizer.ggml.tokens", ARRAY, raw=struct.pack("<IQ", STRING, 1 << 60))),
         "array of"),
    Case("unknown-value-type", "wrong-type", _spec(lambda: with_kv("general.junk", 99, raw=b"")),
         "unknown type"),
    Case("unknown-array-type", "wrong-type",
         _spec(lambda: with_kv("general.junk", ARRAY, raw=struct.pack("<IQ", 77, 1))),
         "unknown element type"),
    Case("tensor-with-9-dims", "damaged-tensors",
         _spec(lambda: Spec(base_kvs(), [Tensor("t", (1,) * 9, 0, b"\0" * 4)])), "9 dimensions"),
    Case("alignment-3", "damaged-tensors", _spec(lambda: with_kv("general.alignment", U32, 3)), "alignment"),
    # wrong types for hyper-parameters
    Case("block-count-string", "wrong-type", _spec(lambda: with_kv(_p("block_count"), STRING, "30")),
         "not a whole number"),
    Case("block-count-nan", "wrong-type", _spec(lambda: with_kv(_p("block_count"), F32, float("nan"))),
         "not a whole number"),
    Case("block-count-array", "wrong-type", _spec(lambda: with_kv(_p("block_count"), ARRAY, (U32, [2, 2]))),
         "a list where"),
    Case("embedding-1e308", "wrong-type", _spec(lambda: with_kv(_p("embedding_length"), F64, 1e308)),
         "not a whole number"),
    Case("rope-scaling-bogus", "wrong-type", _spec(lambda: with_kv(_p("rope.scaling.type"), STRING, "bogus")),
         "RoPE scaling"),
    # absurd hyper-parameters
    Case("block-count-0x7fffffff", "absurd", _spec(lambda: with_kv(_p("block_count"), U32, 0x7FFFFFFF)),
         "2147483647 layers"),
    Case("block-count-0", "absurd", _spec(lambda: with_kv(_p("block_count"), U32, 0)), "0 layers"),
    Case("block-count-513", "absurd", _spec(lambda: with_kv(_p("block_count"), U32, 513)), "513 layers"),
    Case("embedding-2^40", "absurd", _spec(lambda: with_kv(_p("embedding_length"), U64, 1 << 40)),
         "embedding length"),
    Case("context-0", "absurd", _spec(lambda: with_kv(_p("context_length"), U32, 0)), "training context"),
    Case("context-2^40", "absurd", _spec(lambda: with_kv(_p("context_length"), U64, 1 << 40)),
         "training context"),
    Case("head-count-100000", "absurd", _spec(lambda: with_kv(_p("attention.head_count"), U32, 100_000)),
         "attention heads"),
    Case("kv-heads-over-heads", "absurd", _spec(lambda: with_kv(_p("attention.head_count_kv"), U32, 8)),
         "KV heads"),
    Case("head-size-0", "absurd", _spec(lambda: with_kv(_p("attention.key_length"), U32, 0)), "K head size"),
    Case("head-size-1e6", "absurd", _spec(lambda: with_kv(_p("attention.value_length"), U32, 10**6)),
         "V head size"),
    Case("per-layer-heads-wrong-length", "absurd",
         _spec(lambda: with_kv(_p("attention.head_count"), ARRAY, (U32, [2] * 5))), "layers but"),
    Case("vocab-2^30", "absurd", _spec(lambda: with_kv(_p("vocab_size"), U32, 1 << 30)), "vocabulary"),
    Case("experts-used-without-experts", "absurd", _spec(lambda: with_kv(_p("expert_used_count"), U32, 2)),
         "experts used"),
    Case("expert-count-5000", "absurd", _spec(lambda: with_kv(_p("expert_count"), U32, 5000)),
         "5000 experts"),
    Case("nextn-over-layers", "absurd", _spec(lambda: with_kv(_p("nextn_predict_layers"), U32, 3)),
         "next-token prediction"),
]


def write_corpus(directory: Path) -> dict[str, Path]:
    """Write every case's file into ``directory``; returns case name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for case in CASES:
        path = directory / f"{case.name}.gguf"
        path.write_bytes(case.build())
        paths[case.name] = path
    return paths
