"""The app's closed sets of values, declared once (Qt-free, engine-free: settings import them too).

StrEnums compare equal to their strings, so JSON files and the engine's own strings keep working.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StorageType(StrEnum):
    """How K or V values are stored: ggml's type names (a cache's cells, a rung, a snapshot's header)."""

    F32 = "f32"
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q5_0 = "q5_0"


class KvMode(StrEnum):
    """How the KV cache is stored: f16, q8_0, lazy q8_0 (f16 until the f16 view is full), or the ladder
    (allocated as q4_0: f16, then 8-bit, then 4-bit, each rung used when the one before is full)."""

    F16 = "f16"
    Q8_0 = "q8_0"
    LAZY = "lazy"
    LADDER = "ladder"

    @property
    def is_lazy(self) -> bool:
        """Starts in f16 and compacts in place, one step at a time (lazy q8_0 and the ladder)."""
        return self in (KvMode.LAZY, KvMode.LADDER)

    @property
    def storage(self) -> StorageType:
        """The type the cache is allocated as (a lazy cache's last rung)."""
        return {KvMode.F16: StorageType.F16, KvMode.Q8_0: StorageType.Q8_0, KvMode.LAZY: StorageType.Q8_0,
                KvMode.LADDER: StorageType.Q4_0}[self]

    @property
    def choice(self) -> str:
        """Its name in the Settings list and in ``--kv``'s help: "lazy q8_0 (f16 until half full)"."""
        return KV_MODE_WORDS[self].choice

    @property
    def words(self) -> str:
        """Its name in a sentence: "the lazy (16-bit, then 8-bit) cache"."""
        return KV_MODE_WORDS[self].words

    @property
    def note(self) -> str:
        """What choosing it trades, in one line (under the Settings choice)."""
        return KV_MODE_WORDS[self].note

    @property
    def quality(self) -> str:
        """How close its answers stay to f16's, in words: "close to f16"."""
        return KV_MODE_WORDS[self].quality


# the defaults of what a model is loaded with: the settings declare them with these, LoadSpec's fields
# default to them, and every entry point (the app, serve, estimate, models) takes a LoadSpec
DEFAULT_KV_MODE = KvMode.LAZY
DEFAULT_N_CTX = 4096
# the lazy modes' recent f16 window (tokens; native kv_lazy_recent): the W that measured best
# (bench/results/ladder.md, "Recent window")
DEFAULT_KV_RECENT = 128
# and each sequence's first tokens, the attention sinks, in f16 beside it (native kv_lazy_sinks): the S that
# measured best (bench/results/frontier.md, "Attention sinks")
DEFAULT_KV_SINKS = 4


class KvPhase(StrEnum):
    """Where a cache is right now (its phase): on a rung (f16, q8_0, q4_0, q5_0), or converting between
    two (a step). docs/glossary.md."""

    F16 = "f16"
    CONVERTING = "converting"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q5_0 = "q5_0"

    @property
    def words(self) -> str:
        """The rung as a user knows it: "16-bit", "8-bit", "4-bit"."""
        return PHASE_WORDS[self][0]

    @property
    def label(self) -> str:
        """The rung as the memory panel names it: "16-bit (full precision)", "8-bit"."""
        return PHASE_WORDS[self][1]


@dataclass(frozen=True)
class KvModeWords:
    choice: str  # in the Settings list and --kv's help
    words: str  # in a sentence
    note: str  # what choosing it trades, one line
    quality: str  # how close its answers stay to f16's, in words, as measured (bench/results/frontier.md)


# The KV modes and rungs in words, declared once (docs/glossary.md): Settings, --kv, the memory panel,
# the context meter, the banners and the transcript's lines all read them here. In the order Settings
# lists the modes.
KV_MODE_WORDS = {
    KvMode.LAZY: KvModeWords(
        "lazy q8_0 (f16 until half full)", "lazy (16-bit, then 8-bit)",
        "Full f16 precision until the f16 part is full, then compacted to 8-bit in place: about 1.9× the "
        "tokens of f16 in the same memory (less its recent window), nearly exact.",
        # KLD against f16 0.92x (SmolLM2) and 0.95x (Gemma-3) plain q8_0's, with its 128-token window
        "exact until the f16 part is full, then closer to f16 than plain 8-bit"),
    KvMode.LADDER: KvModeWords(
        "ladder (f16 → 8-bit → 4-bit)", "ladder (16-bit, then 8-bit, then 4-bit)",
        "f16, then 8-bit, then 4-bit, each level when the one before is full: about 3.5× the tokens of f16 "
        "in the same memory; the last, 4-bit level trades some quality for length.",
        # on its 4-bit level, with its 128-token window and 4 sinks: KLD 1.67x (SmolLM2) and 3.33x (Gemma-3)
        # plain q8_0's (bench/results/frontier.md)
        "exact, then 8-bit; below 8-bit once its oldest tokens are 4-bit"),
    KvMode.Q8_0: KvModeWords(
        "q8_0", "8-bit", "8-bit from the first token: about 1.9× the tokens of f16 in the same memory.",
        "close to f16"),
    KvMode.F16: KvModeWords("f16", "16-bit", "Full precision throughout: the most memory per token.",
                            "exact"),
}
PHASE_WORDS = {  # (in words, as the memory panel names it)
    KvPhase.F16: ("16-bit", "16-bit (full precision)"),
    KvPhase.CONVERTING: ("compacting", "compacting"),
    KvPhase.Q8_0: ("8-bit", "8-bit"),
    KvPhase.Q4_0: ("4-bit", "4-bit"),
    KvPhase.Q5_0: ("5-bit", "5-bit"),
}


class StepStage(StrEnum):
    START = "start"
    PROGRESS = "progress"
    END = "end"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


class ContextFullPolicy(StrEnum):
    STOP = "stop"
    DROP_OLDEST = "drop_oldest"


class ToolStatus(StrEnum):
    """How a tool call ended, stored with its result in the conversation: it ran (``OK``), the tool or
    its server failed, the user denied it, or it was stopped."""

    OK = "ok"
    ERROR = "error"
    DENIED = "denied"
    CANCELLED = "cancelled"


class ExportFormat(StrEnum):
    MARKDOWN = "markdown"
    JSON = "json"

    @property
    def suffix(self) -> str:
        return ".md" if self is ExportFormat.MARKDOWN else ".json"

    @property
    def file_filter(self) -> str:
        return "Markdown (*.md)" if self is ExportFormat.MARKDOWN else "JSON (*.json)"


class SettingKind(StrEnum):
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    TEXT = "text"  # multi-line
    CHOICE = "choice"
    PATH_LIST = "path_list"
    ENDPOINT_LIST = "endpoint_list"  # host:port entries (remote backends)
