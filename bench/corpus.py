"""The fixed benchmark text: bench/corpus.txt, varied deterministically into as many chapters as needed."""

from __future__ import annotations

import random
from pathlib import Path

from llama_cpp import Llama

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
NAMES = ("Ada Marsh", "Tobias Venn", "Miriam Hale", "Josiah Crane", "Eleanor Pike", "Silas Brook")
MAX_CHAPTERS = 64


def paragraphs() -> list[str]:
    text = CORPUS_PATH.read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def chapter(index: int, paras: list[str]) -> str:
    """Chapter `index`: all paragraphs in a seeded order, with the protagonist's name varied."""
    order = list(range(len(paras)))
    random.Random(index).shuffle(order)
    name = NAMES[index % len(NAMES)]
    body = "\n\n".join(paras[i].replace("{name}", name) for i in order)
    return f"Chapter {index + 1}\n\n{body}\n\n"


def unique_token_count(vocab: Llama) -> int:
    """Tokens of the first chapter: after it the paragraphs repeat (in another order, with another name)."""
    return len(vocab.tokenize(chapter(0, paragraphs()).encode("utf-8"), add_bos=True, special=False))


def build_tokens(vocab: Llama, min_tokens: int) -> list[int]:
    """At least min_tokens tokens of the benchmark text (whole chapters; BOS first if the model has one)."""
    paras = paragraphs()
    text = ""
    for index in range(MAX_CHAPTERS):
        text += chapter(index, paras)
        tokens = vocab.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        if len(tokens) >= min_tokens:
            return tokens
    raise ValueError(f"corpus: {MAX_CHAPTERS} chapters give fewer than {min_tokens} tokens")
