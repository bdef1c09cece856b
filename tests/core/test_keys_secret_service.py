"""The snapshot key in a real OS keyring: GNOME Keyring's Secret Service on a private D-Bus session.

A child Python runs inside ``dbus-run-session`` with ``gnome-keyring-daemon`` unlocked on that bus
and HOME / XDG directories in a temp dir, so the user's own keyrings are never touched. The
daemon is given a throwaway non-empty password: with an empty one it cannot create the login
collection without a (graphical) prompt, and the Secret Service refuses the write.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "app"
TOOLS = ("dbus-run-session", "gnome-keyring-daemon")

CHILD = """
import base64, keyring
from lazykv.core.history.keys import keyring_available, load_or_create_key
backend = keyring.get_keyring()
assert keyring_available(), backend
first = load_or_create_key()
second = load_or_create_key()
print(type(backend).__module__, type(backend).__name__)
print(base64.b64encode(first).decode())
print(base64.b64encode(second).decode())
"""

# $0 is the Python executable, $1 the child code; the daemon forks into the background, is
# unlocked with the password on stdin, and exits with the bus when the child is done.
SESSION = (
    'mkdir -p -m 700 "$XDG_RUNTIME_DIR" && '
    "printf %s lazykv-test | gnome-keyring-daemon --unlock --components=secrets >/dev/null && "
    'exec "$0" -c "$1"'
)


def _run_in_secret_service_session(home: Path) -> subprocess.CompletedProcess[str]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed (Debian packages gnome-keyring, dbus-daemon): "
            "run `make sysdeps`"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "PYTHON_KEYRING", "XDG_"))}
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_RUNTIME_DIR=str(home / "run"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(APP_DIR), env.get("PYTHONPATH")])),
    )
    return subprocess.run(
        ["dbus-run-session", "--", "sh", "-c", SESSION, sys.executable, CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_key_in_gnome_keyring(tmp_path: Path) -> None:
    result = _run_in_secret_service_session(tmp_path)
    assert result.returncode == 0, f"child failed:\n{result.stdout}\n{result.stderr}"
    backend, first, second = result.stdout.split("\n")[:3]
    assert backend == "keyring.backends.SecretService Keyring"
    assert first == second
    assert len(base64.b64decode(first)) == 32
    keyrings = tmp_path / "data" / "keyrings"
    assert any(keyrings.iterdir()), "the key was not stored in the temporary login keyring"


def test_key_survives_a_new_session(tmp_path: Path) -> None:
    """The key is persisted by the keyring daemon, not held by the process."""
    first = _run_in_secret_service_session(tmp_path)
    second = _run_in_secret_service_session(tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split("\n")[1] == second.stdout.split("\n")[1]
