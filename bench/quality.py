"""Section 1, quality: per-position KL divergence and top-1 agreement of q8_0 and lazy against f16.

The logits come from the lockstep pass (bench/lockstep.py); this module accumulates and summarizes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.settings import ModelSpec

COMPARED = ("q8_0", "lazy")


@dataclass
class QualityResult:
    model: ModelSpec
    n_tokens: int  # positions evaluated (= n_ctx)
    n_corpus_tokens: int  # length of the tokenized text before truncation
    n_cells_f16: int
    conversion_pos: int  # first position decoded by the lazy context after its conversion (-1: none)
    kld: dict[str, np.ndarray]  # per position, KLD(f16 || kind) in nats
    top1: dict[str, np.ndarray]  # per position, argmax equal to f16's
    lazy_identical_before: bool  # lazy logits bit-identical to f16 at every position before the conversion
    lazy_max_abs_diff_before: float
    n_unique_tokens: int = 0  # tokens of the first chapter (the corpus before it repeats)

    @property
    def breakpoint(self) -> int:
        return self.conversion_pos if self.conversion_pos >= 0 else self.n_tokens

    def _part(self, values: np.ndarray, after: bool) -> np.ndarray:
        return values[self.breakpoint :] if after else values[: self.breakpoint]

    def mean_kld(self, kind: str, after: bool) -> float:
        values = self._part(self.kld[kind], after)
        return float(values.mean()) if values.size else float("nan")

    def top1_rate(self, kind: str, after: bool) -> float:
        values = self._part(self.top1[kind], after)
        return float(values.mean()) if values.size else float("nan")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log softmax in float64, shifted by the row maximum."""
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def compare_rows(ref: np.ndarray, other: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: KLD(softmax(ref) || softmax(other)) and whether both argmaxes agree."""
    kld = np.empty(len(ref), dtype=np.float64)
    for start in range(0, len(ref), block):
        logp = _log_softmax(ref[start : start + block])
        logq = _log_softmax(other[start : start + block])
        kld[start : start + block] = (np.exp(logp) * (logp - logq)).sum(axis=1)
    top1 = ref.argmax(axis=1) == other.argmax(axis=1)
    return np.maximum(kld, 0.0), top1  # KLD >= 0; only rounding noise of order 1e-16 is clipped


class QualityAccumulator:
    """Collects the comparisons chunk by chunk while the three contexts decode in lockstep."""

    def __init__(self, n_tokens: int, block: int) -> None:
        self.block = block
        self.kld = {kind: np.zeros(n_tokens) for kind in COMPARED}
        self.top1 = {kind: np.zeros(n_tokens, dtype=bool) for kind in COMPARED}
        self.identical = True
        self.max_diff = 0.0

    def add(self, start: int, logits: dict[str, np.ndarray], lazy_was_f16: bool) -> None:
        """The logits of positions start.. of every cache; lazy_was_f16: decoded before the conversion."""
        end = start + len(logits["f16"])
        if lazy_was_f16:
            self.identical &= bool(np.array_equal(logits["f16"], logits["lazy"]))
            self.max_diff = max(self.max_diff, float(np.abs(logits["f16"] - logits["lazy"]).max()))
        for kind in COMPARED:
            self.kld[kind][start:end], self.top1[kind][start:end] = compare_rows(
                logits["f16"], logits[kind], self.block
            )

    def result(self, model: ModelSpec, n_corpus: int, n_f16: int, conversion_pos: int) -> QualityResult:
        return QualityResult(
            model=model,
            n_tokens=len(self.kld["lazy"]),
            n_corpus_tokens=n_corpus,
            n_cells_f16=n_f16,
            conversion_pos=conversion_pos,
            kld=self.kld,
            top1=self.top1,
            lazy_identical_before=self.identical,
            lazy_max_abs_diff_before=self.max_diff,
        )
