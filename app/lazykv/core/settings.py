"""Every user setting declared once; the store persists them as JSON with a schema version.

The settings dialog, validation and the defaults are all derived from ``SETTINGS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import MAX_CTX, MiB
from lazykv.core.engine.planner import AUTO, GpuLayers
from lazykv.core.engine.remote import normalize_endpoints
from lazykv.core.files import write_text_atomic
from lazykv.core.idle import IDLE_DELAY_S, IDLE_FILL
from lazykv.core.kinds import (
    DEFAULT_KV_MODE,
    DEFAULT_KV_RECENT,
    DEFAULT_KV_SINKS,
    DEFAULT_N_CTX,
    KV_MODE_WORDS,
    ContextFullPolicy,
    SettingKind,
)
from lazykv.core.paths import SETTINGS_FILE, config_dir

SCHEMA_VERSION = 3
GPU_LAYERS_AUTO = -1  # n_gpu_layers: as many layers as the memory plan fits on the GPU
MAX_RECENT_MODELS = 8


@dataclass(frozen=True)
class Setting:
    """One option, of one of the SettingKinds (each has its validator here and its editor in the dialog)."""

    name: str
    kind: SettingKind
    default: Any
    label: str
    description: str
    group: str
    choices: tuple[tuple[str, str], ...] = ()  # (value, label) for kind "choice"
    choice_notes: tuple[tuple[str, str], ...] = ()  # (value, one line on what choosing it means)
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    reloads_engine: bool = False  # changing it reloads the model off the GUI thread
    in_dialog: bool = True
    special: str = ""  # what the minimum means, shown in its place (e.g. "0 = automatic")
    flag: str = ""  # its command-line option (lazykv.cli.options), e.g. "--ctx"; "": none
    words: tuple[tuple[str, Any], ...] = ()  # words a command line may give for a value, e.g. ("auto", -1)

    def validate(self, value: Any) -> Any:
        """Return ``value`` as this setting's type, or raise ValueError saying why not."""
        return _VALIDATORS[self.kind](self, value)


def _bool(setting: Setting, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{setting.name}: expected true/false, got {value!r}")
    return value


def _number(setting: Setting, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{setting.name}: expected a number, got {value!r}")
    if setting.kind is SettingKind.INT and value != int(value):
        raise ValueError(f"{setting.name}: expected a whole number, got {value!r}")
    value = int(value) if setting.kind is SettingKind.INT else float(value)
    if setting.minimum is not None and value < setting.minimum:
        raise ValueError(f"{setting.name}: {value} is below the minimum {setting.minimum:g}")
    if setting.maximum is not None and value > setting.maximum:
        raise ValueError(f"{setting.name}: {value} is above the maximum {setting.maximum:g}")
    return value


def _text(setting: Setting, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{setting.name}: expected text, got {value!r}")
    return value


def _choice(setting: Setting, value: Any) -> str:
    if value not in {v for v, _ in setting.choices}:
        known = ", ".join(v for v, _ in setting.choices)
        raise ValueError(f"{setting.name}: {value!r} is not one of {known}")
    return value


def _path_list(setting: Setting, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"{setting.name}: expected a list of paths, got {value!r}")
    return list(value)


def _endpoint_list(setting: Setting, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"{setting.name}: expected a list of host:port entries, got {value!r}")
    try:
        return normalize_endpoints(value)
    except ValueError as err:
        raise ValueError(f"{setting.name}: {err}") from None


_VALIDATORS: dict[SettingKind, Callable[[Setting, Any], Any]] = {
    SettingKind.BOOL: _bool,
    SettingKind.INT: _number,
    SettingKind.FLOAT: _number,
    SettingKind.STR: _text,
    SettingKind.TEXT: _text,
    SettingKind.CHOICE: _choice,
    SettingKind.PATH_LIST: _path_list,
    SettingKind.ENDPOINT_LIST: _endpoint_list,
}


KV_MODE_CHOICES = tuple((mode, mode.choice) for mode in KV_MODE_WORDS)
KV_MODE_NOTES = tuple((mode, mode.note) for mode in KV_MODE_WORDS)
CONTEXT_FULL_CHOICES = (
    (ContextFullPolicy.STOP, "stop and tell me"),
    (ContextFullPolicy.DROP_OLDEST, "drop the oldest turns (keep the system prompt)"),
)

SNAPSHOT_CHOICES = (
    ("keyring", "encrypted, key in the OS keyring"),
    ("passphrase", "encrypted with a passphrase"),
    ("none", "not encrypted"),
)
SNAPSHOT_NOTES = (
    ("keyring", "Conversations and snapshots are encrypted; the key is kept by your system's keyring."),
    ("passphrase", "Conversations and snapshots are encrypted under your passphrase, asked once per "
                   "session; without it they cannot be read."),
    ("none", "Not protected against anyone who can read or change your files: they can read your "
             "conversations, and change a snapshot together with its record in the conversation "
             "database so that a chat resumes from it. Damaged or swapped snapshot files are refused."),
)

REMOTE_GROUP = "Remote backends (llama.cpp RPC servers)"

THEME_CHOICES = (("system", "follow the system"), ("light", "light"), ("dark", "dark"))

SETTINGS: tuple[Setting, ...] = (
    # model and engine
    Setting("model_path", SettingKind.STR, "", "Model", "GGUF model file; empty: the default model "
            "(SmolLM2-135M-Instruct).", "Model", reloads_engine=True, in_dialog=False),
    Setting("recent_models", SettingKind.PATH_LIST, [], "Recent models",
            "Models opened recently, newest first.", "Model", in_dialog=False),
    Setting("model_folders", SettingKind.PATH_LIST, [], "Model folders", "Folders the Models page scans for "
            "GGUF files, besides other tools' own.", "Model", in_dialog=False),
    Setting("kv_mode", SettingKind.CHOICE, DEFAULT_KV_MODE, "KV cache", "How the context memory is stored: "
            "lazy q8_0 keeps full f16 precision until the f16 view is full, then compacts to 8-bit in place; "
            "the ladder goes on to 4-bit.", "Engine", choices=KV_MODE_CHOICES, choice_notes=KV_MODE_NOTES,
            reloads_engine=True, flag="--kv"),
    Setting("kv_recent", SettingKind.INT, DEFAULT_KV_RECENT, "Recent window", "Lazy q8_0 and ladder: the "
            f"last tokens, and the first {DEFAULT_KV_SINKS}, also stay in full 16-bit precision once the "
            "cache has compacted, where attention looks most. They take 16-bit memory beside the cache (the "
            "line under the context says how much). 0: only the first tokens.", "Engine", minimum=0,
            maximum=4096, step=32, reloads_engine=True, special="0 = no recent window", flag="--kv-recent"),
    Setting("n_ctx", SettingKind.INT, DEFAULT_N_CTX, "Context length", "Tokens the model can see at once.",
            "Engine", minimum=256, maximum=MAX_CTX, step=256, reloads_engine=True, flag="--ctx"),
    Setting("context_budget_mb", SettingKind.INT, 0, "Context memory (MiB)", "Choose the context by memory "
            "instead of by tokens: the longest context whose KV cache fits in this many MiB with the KV "
            "cache chosen (at most the model's own limit); 0: use the context length.", "Engine", minimum=0,
            maximum=1_000_000, step=256, reloads_engine=True, special="0 = use the context length",
            flag="--context-budget"),
    Setting("n_threads", SettingKind.INT, 0, "Threads", "CPU threads for the engine; 0: one per core.",
            "Engine", minimum=0, maximum=256, reloads_engine=True, special="0 = automatic (one per core)",
            flag="--threads"),
    Setting("n_gpu_layers", SettingKind.INT, GPU_LAYERS_AUTO, "GPU layers", "Layers on the GPU. Auto: as "
            "many as fit in the GPU's memory with their part of the KV cache and the buffers, leaving 1 GiB "
            "free (or within the GPU memory limit); without a usable GPU the model runs on the CPU. 0: none.",
            "Engine", minimum=GPU_LAYERS_AUTO, maximum=1000, reloads_engine=True,
            special="Auto (as many as fit)", flag="--gpu-layers", words=((AUTO, GPU_LAYERS_AUTO),)),
    Setting("gpu_memory_mb", SettingKind.INT, 0, "GPU memory limit (MiB)", "Use at most this much of each "
            "GPU's memory, so there is room left for the rest of the desktop; 0: its free memory less "
            "1 GiB.", "Engine", minimum=0, maximum=1_000_000, step=256, reloads_engine=True,
            special="0 = free memory less 1 GiB", flag="--gpu-memory"),
    Setting("flash_attn", SettingKind.BOOL, True, "Flash attention", "Needed by the q8_0, lazy and ladder "
            "KV caches.", "Engine", reloads_engine=True, flag="--flash-attn"),
    Setting("idle_conversion", SettingKind.BOOL, True, "Compact while idle", "Lazy cache and ladder: when "
            f"the level in use (16-bit, then the ladder's 8-bit) is at least {IDLE_FILL:.0%} full and the "
            f"engine has been idle for {IDLE_DELAY_S:g} s, compact it one step then, so the pause does not "
            "land inside a reply.", "Engine"),
    Setting("rpc_servers", SettingKind.ENDPOINT_LIST, [], "Servers", "llama.cpp's own way to offload "
            "layers and the KV cache\nto another machine: run ggml-rpc-server there and list it\nhere "
            "as host:port, one per line.", REMOTE_GROUP, reloads_engine=True, flag="--rpc"),
    Setting("rpc_layers", SettingKind.INT, 0, "Layers to offload", "Layers (with their part of the KV "
            "cache) placed on the remote backends when servers are listed; 0: all of them.", REMOTE_GROUP,
            minimum=0, maximum=1000, reloads_engine=True, special="0 = all layers", flag="--rpc-layers"),
    Setting("theme", SettingKind.CHOICE, "system", "Theme", "Light or dark colours; by default those of "
            "the desktop.", "Chat", choices=THEME_CHOICES),
    # conversation
    Setting("system_prompt", SettingKind.TEXT, "", "System prompt", "Default system prompt of new chats.",
            "Chat"),
    Setting("context_full", SettingKind.CHOICE, ContextFullPolicy.STOP, "When the context is full",
            "What to do when the conversation no longer fits the context.", "Chat",
            choices=CONTEXT_FULL_CHOICES),
    Setting("max_reply_tokens", SettingKind.INT, 0, "Longest reply", "Tokens per reply; 0: until the model "
            "stops or the context is full.", "Chat", minimum=0, maximum=131072, special="0 = no limit"),
    # conversations
    Setting("snapshot_encryption", SettingKind.CHOICE, "keyring", "Snapshot protection", "How saved KV "
            "snapshots (which contain the conversation) are protected: a key kept in the OS keyring, a "
            "passphrase asked once per session, or no encryption.", "Conversations",
            choices=SNAPSHOT_CHOICES, choice_notes=SNAPSHOT_NOTES),
    Setting("snapshot_budget_mb", SettingKind.INT, 2048, "Snapshot disk budget (MiB)", "Snapshots beyond "
            "this are deleted, least recently used first; transcripts are never deleted.", "Conversations",
            minimum=16, maximum=1_000_000, step=64),
    Setting("compact_snapshots", SettingKind.BOOL, False, "Compact snapshots", "Ladder: save a chat's "
            "context memory at 4-bit even while it is still 16- or 8-bit, about 3.5x or 1.9x smaller on "
            "disk; the chat then resumes on the 4-bit level (a little less precise). The open chat is not "
            "changed.", "Conversations"),
    Setting("passphrase_salt", SettingKind.STR, "", "Passphrase salt",
            "Salt of the passphrase key (not secret).", "Conversations", in_dialog=False),
    Setting("last_conversation", SettingKind.INT, 0, "Last conversation", "The conversation on screen at "
            "quit (its id; 0: none): the next start opens it again.", "Conversations", in_dialog=False,
            minimum=0, maximum=1 << 62),
    # the local API
    Setting("local_server", SettingKind.BOOL, False, "Local server", "Serve the loaded model over an "
            "OpenAI-compatible API on 127.0.0.1 (for editors, Open WebUI, scripts). Its requests wait for "
            "the chat's on the same engine, and the open chat keeps its context memory. Only this "
            "machine can reach it; the command python -m lazykv serve has more options.", "Local API"),
    Setting("local_server_port", SettingKind.INT, 8080, "Port", "The local server's port on 127.0.0.1 "
            "(its address is http://127.0.0.1:PORT/v1).", "Local API", minimum=1024, maximum=65535),
    Setting("api_cache_mb", SettingKind.INT, 2048, "API cache (MiB)", "The local server keeps each reply's "
            "context memory as a snapshot (protected as the chat's snapshots are), so that a conversation's "
            "next turn reads only its new part, after a restart too; beyond this, the least recently "
            "used go.", "Local API", minimum=16, maximum=1_000_000, step=64),
    # tools the model calls (MCP servers: core.tools)
    Setting("tool_timeout_s", SettingKind.INT, 60, "Tool call timeout (s)", "How long a tool may take to "
            "answer; past it the model is told the tool did not answer, and the chat goes on.", "Tools",
            minimum=1, maximum=3600),
    Setting("tool_output_kib", SettingKind.INT, 64, "Tool output cap (KiB)", "A tool's output beyond this "
            "is cut before the model reads it (a long output would fill the context).", "Tools",
            minimum=1, maximum=16_384),
    # sampling
    Setting("temperature", SettingKind.FLOAT, 0.7, "Temperature", "Randomness; 0 always picks the likeliest "
            "token.", "Sampling", minimum=0.0, maximum=2.0, step=0.05, special="0 = always the likeliest"),
    Setting("top_p", SettingKind.FLOAT, 0.95, "Top-p", "Sample from the likeliest tokens covering this "
            "probability.", "Sampling", minimum=0.0, maximum=1.0, step=0.01),
    Setting("top_k", SettingKind.INT, 40, "Top-k", "Sample from this many likeliest tokens; 0: all.",
            "Sampling", minimum=0, maximum=1000, special="0 = all tokens"),
    Setting("min_p", SettingKind.FLOAT, 0.05, "Min-p", "Drop tokens less likely than this fraction of the "
            "likeliest.", "Sampling", minimum=0.0, maximum=1.0, step=0.01),
    Setting("repeat_penalty", SettingKind.FLOAT, 1.1, "Repeat penalty", "Above 1 discourages repetition.",
            "Sampling", minimum=0.5, maximum=2.0, step=0.05),
    Setting("seed", SettingKind.INT, -1, "Seed", "Random seed of every reply; -1: a new one each time.",
            "Sampling", minimum=-1, maximum=2**31 - 1, special="-1 = random each time"),
)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


def _migrate_1_to_2(values: dict[str, Any]) -> dict[str, Any]:
    """Version 1 called the KV mode ``kv`` and stored the recent models under ``recent``."""
    values = dict(values)
    if "kv" in values:
        values["kv_mode"] = values.pop("kv")
    if "recent" in values:
        values["recent_models"] = values.pop("recent")
    return values


def gpu_layers(value: int) -> GpuLayers:
    """The GPU-layers setting as the engine and the planner take it: its Auto is the plan's "auto"."""
    return AUTO if value == GPU_LAYERS_AUTO else value


# the settings a model is loaded with (load_spec), in a command line's --help order
LOAD_SETTINGS = ("n_ctx", "context_budget_mb", "kv_mode", "kv_recent", "n_gpu_layers", "gpu_memory_mb",
                 "rpc_servers", "rpc_layers", "n_threads", "flash_attn")


def load_spec(values: Mapping[str, Any], model: Path | str, **overrides: Any) -> LoadSpec:
    """What ``model`` is loaded with under these setting ``values`` (a Settings, or its ``values()``), with
    LoadSpec fields in ``overrides`` on top: the one place a setting becomes what the engine takes."""
    spec = LoadSpec(
        Path(model), n_ctx=values["n_ctx"], kv_mode=values["kv_mode"], kv_recent=values["kv_recent"],
        context_budget=values["context_budget_mb"] * MiB, gpu_layers=gpu_layers(values["n_gpu_layers"]),
        gpu_memory=values["gpu_memory_mb"] * MiB, rpc_servers=tuple(values["rpc_servers"]),
        rpc_layers=values["rpc_layers"], n_threads=values["n_threads"], flash_attn=values["flash_attn"],
    )
    return spec.with_(**overrides) if overrides else spec


def _migrate_2_to_3(values: dict[str, Any]) -> dict[str, Any]:
    """Version 2 had no Auto for the GPU layers: its 0 (the default, and the only choice of a CPU build)
    becomes Auto; a number of layers chosen stays."""
    values = dict(values)
    if values.get("n_gpu_layers") == 0:
        values["n_gpu_layers"] = GPU_LAYERS_AUTO
    return values


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_1_to_2, 2: _migrate_2_to_3}


class Settings:
    """Current values of every declared setting; ``save()`` writes them atomically.

    Unknown keys in the file are dropped, invalid values fall back to their default and are
    reported in ``problems`` (shown to the user once), never fatal.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_dir() / SETTINGS_FILE
        self._values: dict[str, Any] = {s.name: _copy(s.default) for s in SETTINGS}
        self.problems: list[str] = []
        self.newer_file = False  # the file is a newer app's: it is kept as it is, never saved over

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        settings = cls(path)
        settings._read()
        return settings

    def __getitem__(self, name: str) -> Any:
        return _copy(self._values[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def set(self, name: str, value: Any) -> bool:
        """Validate and set; True if the value changed. Raises KeyError/ValueError."""
        value = SETTINGS_BY_NAME[name].validate(value)
        if self._values[name] == value:
            return False
        self._values[name] = value
        return True

    def values(self) -> dict[str, Any]:
        return {name: _copy(v) for name, v in self._values.items()}

    def copy(self, overrides: dict[str, Any] | None = None) -> Settings:
        """A separate Settings on the same path (e.g. to save on another thread), ``overrides`` applied."""
        other = Settings(self.path)
        other.newer_file = self.newer_file
        other._values = {**self.values(), **{k: _copy(v) for k, v in (overrides or {}).items()}}
        return other

    def add_recent_model(self, path: str) -> None:
        recent = [p for p in self._values["recent_models"] if p != path]
        self._values["recent_models"] = [path, *recent][:MAX_RECENT_MODELS]

    def save(self) -> None:
        """Write to a temp file in the same dir, fsync, rename: a crash keeps the old or the new file.

        A file written by a newer LazyKV Chat is left as it is (this session's changes are not saved)."""
        if self.newer_file:
            return
        data = json.dumps({"schema_version": SCHEMA_VERSION, "settings": self._values}, indent=2)
        write_text_atomic(self.path, data + "\n")

    def _read(self) -> None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            self.problems.append(f"could not read {self.path} ({err}); using the defaults")
            return
        if not isinstance(raw, dict) or not isinstance(raw.get("settings"), dict):
            self.problems.append(f"{self.path} is not a settings file; using the defaults")
            return
        version, values = raw.get("schema_version"), raw["settings"]
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            self.newer_file = isinstance(version, int)
            self.problems.append(
                f"{self.path} was written by a newer LazyKV Chat (schema {version}); using the defaults "
                "for this session, and the file is kept as it is (changes made now are not saved)"
            )
            return
        while version < SCHEMA_VERSION:
            migrate = MIGRATIONS.get(version)
            if migrate is not None:
                values = migrate(values)
            version += 1
        for name, value in values.items():
            setting = SETTINGS_BY_NAME.get(name)
            if setting is None:
                continue
            try:
                self._values[name] = setting.validate(value)
            except ValueError as err:
                self.problems.append(f"{err}; using the default {setting.default!r}")


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value
