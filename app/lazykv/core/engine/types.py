"""What the engine takes and returns: its errors, the sampling settings, and the records of a
loaded model, of its KV cache, of a conversion step and of a reply."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lazykv.core.engine.memory import DeviceMemory
from lazykv.core.engine.model_meta import ModelMeta
from lazykv.core.engine.planner import Device, Plan
from lazykv.core.engine.remote import Unreachable
from lazykv.core.errors import EngineError
from lazykv.core.kinds import (
    FinishReason,
    KvMode,
    KvPhase,
    StepStage,
)

if TYPE_CHECKING:  # chat_template reaches llama_cpp, which these records need not load
    from lazykv.core.engine.chat_template import ChatTemplateChoice


class ModelFileError(EngineError):
    """The model file is missing or is not a GGUF file."""


class ModelNotFoundError(ModelFileError):
    """No file at the model path."""


class NotGGUFError(ModelFileError):
    """The file does not start with the GGUF magic."""


class ModelLoadError(EngineError):
    """llama.cpp refused a file that looked like GGUF."""


class KvModeError(EngineError):
    """The chosen KV cache mode cannot run this model."""


class ContextBudgetError(EngineError):
    """The context memory budget holds fewer tokens than the smallest context."""


class NoModelError(EngineError):
    """A reply was requested before a model was loaded."""


class PromptError(EngineError):
    """The model's chat template refused the messages (e.g. roles that do not alternate)."""


class GrammarError(EngineError):
    """llama.cpp could not parse a grammar given to constrain a reply."""


class CancelledError(EngineError):
    """The request was cancelled before it finished (what it did so far is kept, see each method)."""


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int | None = None  # None: a fresh random seed for every reply
    presence_penalty: float = 0.0  # OpenAI's penalties (the local API's requests; the app leaves them at 0)
    frequency_penalty: float = 0.0


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    architecture: str
    n_params: int
    n_ctx_train: int
    file_size: int
    n_ctx: int
    kv_mode: KvMode
    n_threads: int
    meta: ModelMeta
    memory: tuple[DeviceMemory, ...] = ()  # what the engine allocated, per place (host, each device)
    plan: Plan | None = None  # the memory plan the load followed (its n_gpu_layers, and why)
    devices: tuple[Device, ...] = ()  # the devices offered to it, with their free/total memory before loading
    plan_note: str = ""  # a sentence about the plan (a GPU build without a usable device: the CPU instead)
    remote: tuple[str, ...] = ()  # the remote backends (llama.cpp RPC servers) the model runs on
    unreachable: tuple[Unreachable, ...] = ()  # those asked for but left out, and why
    chat_template: ChatTemplateChoice | None = None  # the chat format used and why (None: not chosen yet)

    @property
    def name(self) -> str:
        """The file name without .gguf: GGUF 'general.name' is often absent or less telling."""
        return self.path.stem

    @property
    def gpus(self) -> tuple[Device, ...]:
        """This machine's GPUs among the devices offered (RPC servers' devices left out)."""
        return tuple(d for d in self.devices if not d.name.startswith("RPC"))


@dataclass(frozen=True)
class KvStatus:
    """The KV cache right now, as the memory panel shows it."""

    kv_mode: KvMode
    phase: KvPhase  # how the cells are stored now (the rung of a lazy cache)
    n_cells_used: int
    n_cells_capacity: int  # cells the current storage holds (the f16 view while lazy is in f16)
    n_cells_total: int  # cells of the cache (as q8_0 for a lazy cache, as q4_0 for the ladder)
    kv_bytes: int  # allocated for K and V
    n_steps: int = 0
    last_step_s: float = 0.0
    rungs: tuple[KvPhase, ...] = ()  # a lazy cache's steps in order (f16, q8_0[, q4_0]); () when plain
    n_cells_next: int = 0  # cells the next rung holds (== n_cells_capacity on the last; 0 when plain)
    target: KvPhase | None = None  # the rung being converted to, else the last one converted to

    @property
    def next_rung(self) -> KvPhase | None:
        """The rung this cache compacts to next; None on the last, for a plain cache and while converting."""
        if self.phase not in self.rungs:
            return None
        after = self.rungs[self.rungs.index(self.phase) + 1 :]
        return after[0] if after else None

    @property
    def fill(self) -> float:
        return self.n_cells_used / self.n_cells_capacity if self.n_cells_capacity else 0.0

    @property
    def kv_bytes_used(self) -> int:
        """Bytes holding cells in use: the storage fills in proportion to its cells."""
        return int(self.kv_bytes * min(1.0, self.fill))


@dataclass(frozen=True)
class StepEvent:
    """A lazy cache compacting one step (to ``target``): ``start``, ``progress`` per tensor, ``end``."""

    stage: StepStage
    done: int
    total: int
    n_cells: int  # cells (token positions) in use when it started
    duration_s: float = 0.0  # set at ``end``
    target: KvPhase = KvPhase.Q8_0  # the rung it converts to

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


@dataclass(frozen=True)
class ReplyResult:
    text: str
    finish_reason: FinishReason
    n_prompt: int  # tokens of the prompt sent
    n_reused: int  # of those, tokens already in the KV cache (common prefix)
    dropped: list[dict[str, str]] = field(default_factory=list)  # turns left out to fit
    n_generated: int = 0  # tokens of the reply (the limit's count when it ran to ``max_tokens``)
    # the tools it calls (tools offered): OpenAI's {"id", "type", "function": {"name", "arguments"}};
    # ``text`` is then the reply's own words, without the calls
    tool_calls: tuple[dict[str, Any], ...] = ()

    @property
    def cancelled(self) -> bool:
        return self.finish_reason is FinishReason.CANCELLED


@dataclass(frozen=True)
class KvLayout:
    """What a saved KV state must match to restore into a cache (a snapshot's header carries the same):
    the engine, the context, how K and V are stored (their types, the lazy cache's rung and rungs) and
    rotated (the Hadamard rotation of the lazy cache and of the plain one, of the sliding-window layers)."""

    engine_version: str
    n_ctx: int
    kv_mode: KvMode
    type_k: str  # a StorageType's name
    type_v: str
    lazy_phase: str  # the rung its cells are on; "disabled" for a plain cache
    lazy_rungs: tuple[str, ...]
    lazy_rot_k: int
    lazy_rot_v: int
    n_rot_k: int
    n_rot_v: int
    n_rot_k_swa: int
    n_rot_v_swa: int
    state_version: int  # the per-sequence state format


@dataclass(frozen=True)
class KvSnapshot:
    """One conversation's KV cache as the engine saved it: what it is, its tokens, the state bytes."""

    layout: KvLayout
    tokens: list[int]
    state: bytes  # the sequence state with its metadata (opaque to callers)


class KvRestoreError(EngineError):
    """A saved KV state was refused; the cache is left empty and the transcript must be re-read."""
