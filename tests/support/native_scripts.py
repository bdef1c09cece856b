"""The project's native scripts (native/build.py, native/check_series.py) loaded as modules, for the tests
that ask them what they would do."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NATIVE = Path(__file__).resolve().parents[2] / "native"


def load_native_script(file_name: str, module_name: str) -> ModuleType:
    """native/``file_name`` as the module ``module_name`` (registered first: its dataclasses look their
    module up)."""
    spec = importlib.util.spec_from_file_location(module_name, NATIVE / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
