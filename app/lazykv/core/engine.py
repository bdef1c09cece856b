"""One conversation's engine session over the patched ``llama_cpp.Llama`` (Qt-free)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

GGUF_MAGIC = b"GGUF"
KV_MODES = ("f16", "q8_0", "lazy")


class EngineError(RuntimeError):
    """The engine could not do what was asked; the message is meant for the user."""


class ModelFileError(EngineError):
    """The model file is missing or is not a GGUF file."""


class ModelNotFoundError(ModelFileError):
    """No file at the model path."""


class NotGGUFError(ModelFileError):
    """The file does not start with the GGUF magic."""


class ModelLoadError(EngineError):
    """llama.cpp refused a file that looked like GGUF."""


class NoModelError(EngineError):
    """A reply was requested before a model was loaded."""


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int | None = None  # None: a fresh random seed for every reply


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    architecture: str
    n_params: int
    n_ctx_train: int
    file_size: int
    n_ctx: int
    kv_mode: str

    @property
    def name(self) -> str:
        """The file name without .gguf: GGUF 'general.name' is often absent or less telling."""
        return self.path.stem


def check_model_file(path: Path) -> None:
    """Raise a ModelFileError unless ``path`` is a readable file starting with the GGUF magic.

    Checked here because llama.cpp reports a non-GGUF file only as a generic load failure.
    """
    if not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")
    try:
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as err:
        raise ModelFileError(f"cannot read model file {path}: {err.strerror}") from err
    if magic != GGUF_MAGIC:
        raise NotGGUFError(f"not a GGUF model file (no GGUF magic): {path}")


def _kv_cache_params(kv_mode: str) -> dict[str, object]:
    if kv_mode == "f16":
        return {"flash_attn": True}
    if kv_mode == "q8_0":
        return {"flash_attn": True, "type_k": llama_cpp.GGML_TYPE_Q8_0, "type_v": llama_cpp.GGML_TYPE_Q8_0}
    if kv_mode == "lazy":
        return {
            "flash_attn": True,
            "type_k": llama_cpp.GGML_TYPE_Q8_0,
            "type_v": llama_cpp.GGML_TYPE_Q8_0,
            "kv_lazy_quant": True,
        }
    raise EngineError(f"unknown KV cache mode {kv_mode!r} (known: {', '.join(KV_MODES)})")


class EngineSession:
    """A loaded model and its context, used for one conversation from one thread at a time."""

    def __init__(self) -> None:
        self._llama: llama_cpp.Llama | None = None
        self._info: ModelInfo | None = None

    def load(
        self, model_path: Path | str, n_ctx: int = 4096, kv_mode: str = "f16", n_threads: int | None = None
    ) -> ModelInfo:
        """Load a model, replacing the current one only once the new one has loaded.

        On any error the previous model stays loaded and usable.
        """
        path = Path(model_path)
        check_model_file(path)
        kv_params = _kv_cache_params(kv_mode)
        try:
            llama = llama_cpp.Llama(
                model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=False, **kv_params
            )
        except ValueError as err:  # llama_cpp raises ValueError for every native load failure
            raise ModelLoadError(f"llama.cpp could not load {path.name}: {err}") from err
        info = ModelInfo(
            path=path,
            architecture=llama.metadata.get("general.architecture", "unknown"),
            n_params=llama_cpp.llama_model_n_params(llama.model),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(llama.model),
            file_size=path.stat().st_size,
            n_ctx=llama.n_ctx(),
            kv_mode=kv_mode,
        )
        self.close()
        self._llama, self._info = llama, info
        return info

    def model_info(self) -> ModelInfo:
        if self._info is None:
            raise NoModelError("no model is loaded")
        return self._info

    def stream_reply(
        self,
        messages: Sequence[dict[str, str]],
        sampling: SamplingSettings,
        cancel: threading.Event,
        max_tokens: int | None = None,
    ) -> Iterator[str]:
        """Yield the assistant's reply to ``messages`` piece by piece, formatted by the model's template.

        ``cancel`` is checked after every streamed piece. llama.cpp streams one token per piece,
        so generation stops within one token of ``cancel`` being set (a few more only while it
        holds back an incomplete UTF-8 character or a partial stop string). ``max_tokens=None``
        lets the reply run to the end of the model's turn or of the context.
        """
        if self._llama is None:
            raise NoModelError("no model is loaded")
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(32)
        try:
            chunks = self._llama.create_chat_completion(
                messages=list(messages),
                stream=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repeat_penalty=sampling.repeat_penalty,
                seed=seed,
                max_tokens=max_tokens,
            )
            try:
                for chunk in chunks:
                    if cancel.is_set():
                        return
                    piece = chunk["choices"][0]["delta"].get("content")
                    if piece:
                        yield piece
            finally:
                chunks.close()
        except ValueError as err:  # e.g. the conversation no longer fits the context
            raise EngineError(str(err)) from err

    def close(self) -> None:
        """Free the model and its context now rather than at garbage collection."""
        if self._llama is not None:
            self._llama.close()
        self._llama, self._info = None, None
