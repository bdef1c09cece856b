"""Start-up check that the patched engine (not a stock llama-cpp-python) is installed."""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_BASE_VERSION = "0.3.36"
PATCH_LABEL = "+lazykv."
FIX_HINT = "run `make engine` in the LazyKV Chat source tree (or reinstall the app bundle)"


class EngineMissingError(RuntimeError):
    """The installed llama_cpp is missing or is not LazyKV's patched build."""


@dataclass(frozen=True)
class EngineInfo:
    version: str  # e.g. 0.3.36+lazykv.1a2b3c4d5e
    patch_set: str  # the patch-set label, e.g. lazykv.1a2b3c4d5e


def check_engine() -> EngineInfo:
    """Return the engine's version, or raise EngineMissingError saying what to run."""
    try:
        import llama_cpp
    except Exception as err:  # ImportError, or OSError from a broken native library
        raise EngineMissingError(
            f"the LazyKV engine (llama_cpp) cannot be loaded: {err}; {FIX_HINT}"
        ) from err
    version = getattr(llama_cpp, "__version__", "unknown")
    if not version.startswith(ENGINE_BASE_VERSION + PATCH_LABEL):
        raise EngineMissingError(
            f"llama_cpp {version} is installed, but LazyKV Chat needs the patched engine "
            f"{ENGINE_BASE_VERSION}{PATCH_LABEL}<patch set>; {FIX_HINT}"
        )
    if not hasattr(llama_cpp, "StateMismatchError") or not hasattr(llama_cpp.Llama, "kv_lazy_info"):
        raise EngineMissingError(f"llama_cpp {version} lacks LazyKV's engine API; {FIX_HINT}")
    return EngineInfo(version=version, patch_set=version.split("+", 1)[1])
