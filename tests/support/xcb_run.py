"""Run one scenario of a test module in the real app on Qt's xcb platform (Xvfb with openbox), from pytest.

The scenario module is run as ``python -m MODULE SCENARIO OUT -- APP-ARGS`` in a child process (the app owns
its own QApplication there): it writes what it saw as JSON into ``OUT``; an error is reported with the
scenario's traceback, the screen it saw and the child's log. Qt-free: pytest's process stays offscreen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools import xcb_smoke

ROOT = Path(__file__).resolve().parents[2]


def play(module: str, scenario: str, out: Path, app_args: list[str]) -> tuple[dict[str, Any], str]:
    """What ``scenario`` of ``module`` saw, and the child's log (stdout and stderr)."""
    missing = xcb_smoke.missing_tools()
    assert not missing, f"missing {missing}: run tools/sysdeps.sh"
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with xcb_smoke.x_desktop() as display:
        done = subprocess.run([sys.executable, "-m", module, scenario, str(out), "--", *app_args],
                              env={**env, "DISPLAY": display}, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
    log = done.stdout + done.stderr
    assert out.exists(), f"the scenario wrote nothing (exit {done.returncode}):\n{log}"
    seen = json.loads(out.read_text())
    assert "error" not in seen, f"{seen['error']}\n{seen.get('traceback', '')}\n{seen.get('screen')}\n{log}"
    assert done.returncode == 0 and "qt.qpa" not in log, log
    return seen, log
