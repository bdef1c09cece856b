"""One model as the library lists it, wherever it was found: a file (or the shards of a split file) on
disk, with what its GGUF header says, or the reason it cannot be offered as a chat model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lazykv.core.engine.model_meta import GGUFError, ModelMeta, read_model_meta
from lazykv.core.engine.shards import merged_meta, split_info

# a quantization named in a file name: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, MXFP4, TQ1_0 ...
_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Za-z0-9]+)*|BF16|F16|F32|MXFP4|TQ\d_\d)(?![A-Za-z0-9])",
                    re.IGNORECASE)
# llama_ftype (general.file_type): the weights' quantization when no file name says it (Ollama's blobs)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}
PROJECTOR_ARCHS = frozenset({"clip", "mllama_vision"})
NOT_A_CHAT_MODEL = "a projector (mmproj) for a vision model, not a chat model"


def quant_of(name: str, file_type: int = -1) -> str:
    """The quantization a file name says (the last one named), else general.file_type's, else ""."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    info = split_info(name)
    if info is not None:
        stem = info[0]
    found = _QUANT.findall(stem)
    if found:
        return found[-1].upper()
    return FILE_TYPES.get(file_type, "")


def is_projector_name(name: str) -> bool:
    return "mmproj" in name.lower()


@dataclass(frozen=True)
class ModelRecord:
    """A model on disk. ``path`` is what the engine opens (a split model's first shard); ``problem`` says
    why it is not offered as a chat model ("" when it is)."""

    path: Path
    source: str  # the tool whose folder holds it: "Hugging Face cache", "LM Studio", "Ollama", ...
    label: str  # how that tool names it: a repo id, an Ollama name:tag, a path under the folder
    shards: tuple[Path, ...]
    size: int  # bytes, all shards together
    name: str = ""
    architecture: str = ""
    n_params: int = 0
    quant: str = ""
    n_ctx_train: int = 0
    has_chat_template: bool = False
    problem: str = ""
    details: str = ""  # what exactly was wrong, for "Details"
    meta: ModelMeta | None = field(default=None, compare=False, repr=False)

    @property
    def usable(self) -> bool:
        return not self.problem

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "source": self.source, "label": self.label,
            "shards": [str(p) for p in self.shards], "size": self.size, "name": self.name,
            "architecture": self.architecture, "n_params": self.n_params, "quant": self.quant,
            "n_ctx_train": self.n_ctx_train, "has_chat_template": self.has_chat_template,
            "problem": self.problem,
        }


def record_for(shards: Sequence[Path], source: str, label: str, expected: int = 1,
               named: bool = True) -> ModelRecord:
    """The record of one model from its files (``expected`` shards), reading each GGUF header; never raises
    for a file's content: a damaged, foreign or incomplete model gets its ``problem``. ``named``: the file
    names are the model's (not content hashes, as Ollama's blobs), so they may say the quantization."""
    first = shards[0]
    sizes = [_size(p) for p in shards]
    base = ModelRecord(first, source, label, tuple(shards), sum(sizes),
                       name=file_model_name(first.name) if named else label,
                       quant=quant_of(first.name) if named else "")
    if len(shards) < expected:
        have = {split_info(p.name)[1] for p in shards if split_info(p.name)}
        missing = [str(i) for i in range(1, expected + 1) if i not in have]
        return _with_problem(base, f"a split model missing shard {', '.join(missing)} of {expected}")
    if is_projector_name(first.name):
        return _with_problem(base, NOT_A_CHAT_MODEL)
    try:
        metas = [read_model_meta(p) for p in shards]
    except GGUFError as err:
        return _with_problem(base, str(err).rstrip("."), err.details)
    meta = metas[0]
    if meta.architecture in PROJECTOR_ARCHS:
        return _with_problem(base, NOT_A_CHAT_MODEL)
    whole = merged_meta(metas)  # what the memory plan needs: every shard's tensors
    return replace(
        base, architecture=meta.architecture, n_params=whole.n_params,
        quant=base.quant or FILE_TYPES.get(meta.file_type, ""),
        n_ctx_train=meta.n_ctx_train, has_chat_template=meta.has_chat_template, meta=whole,
    )


def file_model_name(file_name: str) -> str:
    """A model's name as the rest of the app says it (the status bar, Settings, the recent list): its file
    name without ``.gguf`` and, for a split model, without the shard number. Not ``general.name``, which
    often reads as a training run's label ("Smollm2 135M 8k Lc100K Mix1 Ep2")."""
    info = split_info(file_name)
    if info is not None:
        return info[0]
    return file_name[:-5] if file_name.lower().endswith(".gguf") else file_name


def _with_problem(record: ModelRecord, problem: str, details: str = "") -> ModelRecord:
    return replace(record, problem=problem, details=details or problem)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def human_params(n: int) -> str:
    """135M, 1.5B, 14B: a parameter count as model names put it."""
    if n >= 10**9:
        return f"{n / 10**9:.1f}B".replace(".0B", "B")
    if n >= 10**6:
        return f"{n / 10**6:.0f}M"
    return str(n) if n else "?"
