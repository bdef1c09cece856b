"""``python -m lazykv COMMAND``: every terminal subcommand starts without Qt."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lazykv import cli

# runs one subcommand's --help in a fresh interpreter, then says whether any Qt module was imported
CHILD = """
import sys
from lazykv import __main__ as entry
try:
    entry.main([sys.argv[1], "--help"])
except SystemExit:
    pass
qt = sorted(m for m in sys.modules
            if m.split(".")[0] in ("PySide6", "shiboken6") or m.startswith("lazykv.qt"))
print("QT-MODULES", ",".join(qt))
"""


def test_the_entry_module_imports_no_qt() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, lazykv.__main__; "
         "print(sorted(m for m in sys.modules if m.startswith(('PySide6', 'lazykv.qt'))))"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", cli.names())
def test_a_subcommand_imports_no_qt(name: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=120)
    line = next(x for x in done.stdout.splitlines() if x.startswith("QT-MODULES"))
    assert line == "QT-MODULES ", f"python -m lazykv {name} imported Qt: {line}\n{done.stderr}"
    assert "usage:" in done.stdout, done.stderr
