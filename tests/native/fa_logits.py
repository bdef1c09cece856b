"""python fa_logits.py MODEL OUT.npy [f16|q8_0] [ref]: logits of a context, for comparing FA paths end to end.

With `ref`, the context's CPU backend runs ggml-cpu's reference paths (llama_set_cpu_use_ref). Run in a
child process: a context with a crashing path fails one test, not the run. Prefills N_PROMPT tokens in
n_ubatch chunks (the tiled prefill kernel), then decodes N_DECODE tokens one by one at a depth above 512
KV cells (the split-KV decode path), and saves the logits of the prompt's last N_OUT positions and of
every decoded token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp  # noqa: E402
from llama_cpp._logger import set_verbose  # noqa: E402
from rawctx import RawContext, RawModel  # noqa: E402

N_CTX = 1024
N_PROMPT = 640
N_DECODE = 8
N_OUT = 32
TEXT = (
    "{i}. The old lighthouse keeper climbed the stairs every evening at dusk, counted the steps, checked "
    "the lamp and wrote one line in his log about the weather, the ships and the birds he had seen. "
)


def prompt_tokens(model: RawModel, n: int) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model.ptr)
    text = "".join(TEXT.format(i=i) for i in range(n // 8)).encode()
    buf = (llama_cpp.llama_token * (len(text) + 8))()
    got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
    assert got >= n, got
    return list(buf[:n])


def decode_chunk(ctx: RawContext, tokens: list[int], pos0: int, n_out: int) -> np.ndarray:
    """Decode `tokens` at positions pos0.. and return the logits of the last n_out of them."""
    b = ctx.batch
    b.n_tokens = len(tokens)
    for i, tok in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos0 + i, 1
        b.seq_id[i][0] = 0
        b.logits[i] = i >= len(tokens) - n_out
    assert llama_cpp.llama_decode(ctx.ptr, b) == 0
    n_vocab = ctx.model.n_vocab
    rows = [llama_cpp.llama_get_logits_ith(ctx.ptr, i) for i in range(len(tokens) - n_out, len(tokens))]
    return np.stack([np.ctypeslib.as_array(r, shape=(n_vocab,)).copy() for r in rows])


def main(model_path: str, out: str, kv: str = "q8_0", path: str = "") -> None:
    set_verbose(False)
    model = RawModel(Path(model_path))
    kv_type = llama_cpp.GGML_TYPE_F16 if kv == "f16" else llama_cpp.GGML_TYPE_Q8_0
    ctx = RawContext(model, kv_type, n_ctx=N_CTX)
    if path == "ref":
        assert llama_cpp.llama_set_cpu_use_ref(ctx.ptr, True)
    tokens = prompt_tokens(model, N_PROMPT + N_DECODE)
    decode_chunk(ctx, tokens[:512], 0, 1)
    rows = [decode_chunk(ctx, tokens[512:N_PROMPT], 512, N_OUT)]
    rows += [decode_chunk(ctx, [tok], N_PROMPT + i, 1) for i, tok in enumerate(tokens[N_PROMPT:])]
    np.save(out, np.concatenate(rows))


if __name__ == "__main__":
    main(*sys.argv[1:])
