"""The app's closed sets of values, declared once (Qt-free, engine-free: settings import them too).

StrEnums compare equal to their strings, so JSON files and the engine's own strings keep working.
"""

from __future__ import annotations

from enum import StrEnum


class KvMode(StrEnum):
    """How the KV cache is stored: f16, q8_0, or lazy q8_0 (f16 until the f16 view is full)."""

    F16 = "f16"
    Q8_0 = "q8_0"
    LAZY = "lazy"


DEFAULT_KV_MODE = KvMode.LAZY  # the settings' default, EngineSession.load's and EngineConfig's


class KvPhase(StrEnum):
    """How a cache's cells are stored right now."""

    F16 = "f16"
    CONVERTING = "converting"
    Q8_0 = "q8_0"


class ConversionStage(StrEnum):
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
