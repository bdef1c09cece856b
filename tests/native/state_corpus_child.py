"""One configuration of the damaged-state corpus, run in a child process by test_state_corpus.py.

A context of one KV mode saves its state through each API in turn; the state is then damaged
(truncated, or one bit flipped, at many offsets) and restored into a context of the same
mode that already holds another conversation. Each variant prints two JSON lines: the
variant before it is tried (so that the parent can name the one that killed the process)
and its outcome: "refused" (StateMismatchError; the context must then decode exactly as a
fresh one: the same logits, bit for bit, after a short probe and after one greedy token more),
"restored" (the damage went undetected, e.g. a flipped value bit: decoding afterwards must
not crash) or "decode-error" (restored, then the engine refused to decode: an error, not a
crash).

    python -m tests.native.state_corpus_child MODEL MODE
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama, LlamaState, StateMismatchError

from .helpers import make_llama

APIS = ["memory-whole", "memory-seq", "file-whole", "file-seq"]
N_CTX = 512  # the lazy cache's f16 view holds 256 cells
N_TOKENS = {"f16": 80, "q8_0": 80, "lazy-before": 80, "lazy-after": 300}
N_TRUNCATIONS = 12  # per API: half in the first HEADER_BYTES, half spread over the rest
N_FLIPS = 12
N_PROBE = 4  # decoding costs per token: a short probe, its logits compared in full
HEADER_BYTES = 128  # the extension block, stream count, rotation sizes, cell count, first cells

TEXT = (
    b"The old lighthouse keeper climbed the stairs every evening at dusk. He counted the steps, "
    b"checked the lamp, and wrote one line in his log. Ships passed in the dark and the light "
    b"turned above them, patient and bright, while the sea kept its own slow time below. "
)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def context(model: Path, mode: str) -> Llama:
    return make_llama(model, "lazy" if mode.startswith("lazy") else mode, n_ctx=N_CTX)


def filled(model: Path, mode: str, tokens: list[int]) -> Llama:
    llm = context(model, mode)
    llm.eval(tokens)
    if mode == "lazy-after":
        assert llm.kv_lazy_info().phase == "q8_0", "the lazy cache should have converted"
    return llm


def last_logits(llm: Llama) -> np.ndarray:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def decoded(llm: Llama, probe: list[int]) -> list[np.ndarray]:
    """The logits after ``probe`` decoded from position 0, and after one greedy token more."""
    llm.reset()
    llm.eval(probe)
    first = last_logits(llm)
    llm.eval([int(first.argmax())])
    return [first, last_logits(llm)]


def same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def variants(size: int) -> list[tuple[str, int]]:
    """(kind, offset): truncations and single-bit flips, dense in the header, spread over the rest."""
    rng = random.Random(size)
    head = min(HEADER_BYTES, size - 1)
    cuts = sorted({*range(1, head, max(1, head // (N_TRUNCATIONS // 2))),
                   *(size * k // (N_TRUNCATIONS // 2 + 1) for k in range(1, N_TRUNCATIONS // 2 + 1))})
    flips = sorted({*range(0, head, max(1, head // (N_FLIPS * 3 // 5))),
                    *(rng.randrange(head, size) for _ in range(N_FLIPS * 2 // 5))})
    return [("truncate", c) for c in cuts] + [("flip", f) for f in flips]


def damage(blob: bytes, kind: str, offset: int, bit: int) -> bytes:
    if kind == "truncate":
        return blob[:offset]
    out = bytearray(blob)
    out[offset] ^= 1 << bit
    return bytes(out)


def main(model: Path, mode: str) -> int:
    fresh = context(model, mode)
    tokens = fresh.tokenize(TEXT * 8)
    probe = tokens[-N_PROBE:]
    expected = decoded(fresh, probe)
    src = filled(model, mode, tokens[: N_TOKENS[mode]])
    # the target already holds another conversation (converted, for lazy-after)
    target = filled(model, mode, tokens[5 : 5 + N_TOKENS[mode]])
    base = target.save_state()
    tmp = Path(tempfile.mkdtemp(prefix="state-corpus-"))
    for api in APIS:
        run_api(api, src, target, base, probe, expected, tmp)
    emit(done=True)
    return 0


def run_api(api: str, src: Llama, target: Llama, base: LlamaState, probe: list[int],
            expected: list[np.ndarray], tmp: Path) -> None:
    seq_id = 0 if api.endswith("seq") else None

    if api.startswith("memory"):
        good = src.save_state(seq_id=seq_id)
        blob = good.llama_state
    else:
        path = tmp / "good.bin"
        src.save_state_file(path, seq_id=seq_id)
        blob = path.read_bytes()

    rng = random.Random(len(blob))
    for kind, offset in variants(len(blob)):
        bit = rng.randrange(8)
        name = f"{api}:{kind}@{offset}" + (f".{bit}" if kind == "flip" else "")
        emit(start=name)
        target.load_state(base)
        bad = damage(blob, kind, offset, bit)
        try:
            if api.startswith("memory"):
                target.load_state(LlamaState(
                    input_ids=good.input_ids, scores=good.scores, n_tokens=good.n_tokens,
                    llama_state=bad, llama_state_size=len(bad), seed=good.seed, seq_id=seq_id,
                    metadata=good.metadata,  # passes the pre-check: the engine itself must refuse
                ))
            else:
                path = tmp / "bad.bin"
                path.write_bytes(bad)
                target.load_state_file(path, seq_id=seq_id)
        except StateMismatchError:
            usable = target.n_tokens == 0 and same(decoded(target, probe), expected)
            emit(variant=name, outcome="refused", usable=usable)
            continue
        try:
            decoded(target, probe)
            emit(variant=name, outcome="restored", usable=True)
        except RuntimeError as err:
            emit(variant=name, outcome="decode-error", usable=True, error=str(err)[:200])


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
