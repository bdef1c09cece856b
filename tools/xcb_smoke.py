"""Start the app on a real X server and check its window: Xvfb + openbox, Qt's ``xcb`` platform.

``python3 tools/xcb_smoke.py --screenshot SHOT.png -- COMMAND [ARGS...]`` starts a private Xvfb
display with the openbox window manager (so the window is managed, framed and closed as on a
desktop), runs COMMAND there with ``QT_QPA_PLATFORM=xcb`` whatever the caller set, waits until the
window manager lists a window whose title matches ``--title`` (by default: ends with "LazyKV Chat";
"SmolLM2.* — LazyKV Chat" waits until the model has loaded), checks that it is mapped, takes a
screenshot of the screen (ImageMagick ``import -window root``), asks the window manager to close
the window (what the title bar's close button does) and checks that the app then exits with 0.
The app runs inside its own D-Bus session with an unlocked gnome-keyring, as on a desktop
(``--no-keyring``: without one).

Standard library only: ``make dist-check`` runs it against the installed bundle with any Python 3,
``tests/test_xcb_smoke.py`` against the source tree. Needs Xvfb, openbox, wmctrl, xwininfo and
ImageMagick, and dbus-run-session and gnome-keyring-daemon (``tools/sysdeps.sh`` installs them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TITLE = r".*LazyKV Chat$"
SCREEN = "1400x900x24"
PAINTED_COLOURS = 16  # a desktop showing more colours than this has the window painted on it
TOOLS = ("Xvfb", "openbox", "wmctrl", "xwininfo", "import", "convert", "dbus-run-session",
         "gnome-keyring-daemon")
# a D-Bus session with a Secret Service, as a desktop session has; $1 is where the keyring is kept
KEYRING_SESSION = (
    'keyrings="$1"; shift; printf %s lazykv-smoke | '
    'XDG_DATA_HOME="$keyrings" gnome-keyring-daemon --unlock --components=secrets >/dev/null && '
    'exec "$@"'
)


class SmokeError(RuntimeError):
    """The app did not show its window, or did not close cleanly; the message says which."""


@dataclass
class SmokeResult:
    title: str
    map_state: str
    x: int  # of the window's contents, on the screen
    y: int
    width: int
    height: int
    colours: int  # distinct colours in the screenshot: a blank screen has 1
    exit_code: int
    log: str


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


@contextmanager
def x_desktop(screen: str = SCREEN) -> Iterator[str]:
    """A private Xvfb display with openbox running on it; yields the DISPLAY value."""
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", screen, "-nolisten", "tcp"],
        pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    wm = None
    try:
        with os.fdopen(read_fd) as pipe:
            number = pipe.readline().strip()
        if not number:
            raise SmokeError("Xvfb did not start")
        display = f":{number}"
        env = {**os.environ, "DISPLAY": display}
        wm = _start_window_manager(env)
        yield display
    finally:
        for process in (wm, xvfb):
            if process is not None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _start_window_manager(env: Mapping[str, str], tries: int = 3, seconds: float = 60) -> subprocess.Popen:
    """openbox on the display in ``env``, once ``wmctrl`` sees it manage the screen.

    On a loaded machine (the test suite on two cores) openbox can take long to start, or exit before
    it took the display; it is started again, up to ``tries`` times, and what it printed is kept for
    the error."""
    said = ""
    for _ in range(tries):
        with tempfile.TemporaryFile() as log:
            wm = subprocess.Popen(["openbox", "--sm-disable"], env=dict(env), stdout=log, stderr=log)
            deadline = time.monotonic() + seconds
            while wm.poll() is None and time.monotonic() < deadline:
                if _quiet(["wmctrl", "-m"], env) is not None:
                    return wm
                time.sleep(0.1)
            if wm.poll() is None:
                wm.kill()
            wm.wait()
            log.seek(0)
            said = log.read().decode(errors="replace").strip()
    raise SmokeError(f"openbox did not take the display ({tries} tries)"
                     + (f": {said[-500:]}" if said else ""))


def run_app(
    command: Sequence[str], screenshot: Path, env: Mapping[str, str] | None = None, timeout: float = 120,
    title: str = TITLE, keyring: bool = True, keyring_dir: Path | None = None,
    before_close: Callable[[str, dict[str, str]], None] | None = None,
) -> SmokeResult:
    """Run ``command`` on a fresh X desktop; check, photograph and close its main window.

    ``keyring_dir``: where gnome-keyring keeps its keyrings (a temporary dir by default; pass the
    same dir to runs that must find the key the previous one stored, as after a re-login).
    ``before_close(window id, environment for X tools)`` runs after the screenshot, e.g. to move or
    resize the window through the window manager as a user would.
    """
    with x_desktop() as display, tempfile.TemporaryDirectory(prefix="lazykv-xcb-") as runtime:
        child_env = {**(env if env is not None else os.environ), "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
        if keyring:
            child_env = {k: v for k, v in child_env.items() if not k.startswith(("DBUS_", "PYTHON_KEYRING"))}
            (Path(runtime) / "run").mkdir(mode=0o700)
            child_env["XDG_RUNTIME_DIR"] = str(Path(runtime) / "run")
            keyrings = keyring_dir or Path(runtime) / "keyrings"
            keyrings.mkdir(mode=0o700, parents=True, exist_ok=True)
            command = ["dbus-run-session", "--", "sh", "-c", KEYRING_SESSION, "sh", str(keyrings), *command]
        x_env = {**os.environ, "DISPLAY": display}
        log_path = screenshot.with_suffix(".log")
        with open(log_path, "w+b") as log:
            app = subprocess.Popen(list(command), env=child_env, stdout=log, stderr=subprocess.STDOUT)
            try:
                window, title = _wait_for_window(app, x_env, title, timeout, log_path)
                info = _quiet(["xwininfo", "-id", window], x_env) or ""
                colours = _photograph_once_painted(screenshot, x_env)
                if before_close is not None:
                    before_close(window, x_env)
                subprocess.run(["wmctrl", "-i", "-c", window], env=x_env, check=True)
                exit_code = app.wait(timeout)
            except subprocess.TimeoutExpired as err:
                raise SmokeError(f"the app did not exit within {timeout:.0f} s of its window being closed:\n"
                                 f"{log_path.read_text(errors='replace')}") from err
            finally:
                if app.poll() is None:
                    app.kill()
                    app.wait()
        return SmokeResult(
            title=title,
            map_state=_field(info, "Map State"),
            x=int(_field(info, "Absolute upper-left X") or 0),
            y=int(_field(info, "Absolute upper-left Y") or 0),
            width=int(_field(info, "Width") or 0),
            height=int(_field(info, "Height") or 0),
            colours=colours,
            exit_code=exit_code,
            log=log_path.read_text(errors="replace"),
        )


def _wait_for_window(app: subprocess.Popen, env: Mapping[str, str], pattern: str, timeout: float,
                     log_path: Path) -> tuple[str, str]:
    """(window id, title) of the first window the window manager lists with a title matching ``pattern``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise SmokeError(f"the app exited with status {app.returncode} before showing a window:\n"
                             f"{log_path.read_text(errors='replace')}")
        for line in (_quiet(["wmctrl", "-l"], env) or "").splitlines():
            window, _desktop, _host, title = (line.split(None, 3) + ["", "", "", ""])[:4]
            if re.fullmatch(pattern, title):
                return window, title
        time.sleep(0.2)
    raise SmokeError(f"no window titled like {pattern!r} within {timeout:.0f} s:\n"
                     f"{log_path.read_text(errors='replace')}")


def _photograph_once_painted(screenshot: Path, env: Mapping[str, str], timeout: float = 10) -> int:
    """Screenshot the desktop until it shows more than a few colours (the window has painted), at most
    ``timeout`` seconds; the number of colours of the last one."""
    deadline = time.monotonic() + timeout
    while True:
        subprocess.run(["import", "-window", "root", str(screenshot)], env=dict(env), check=True)
        colours = int(subprocess.run(["convert", str(screenshot), "-format", "%k", "info:"],
                                     capture_output=True, text=True, check=True).stdout)
        if colours > PAINTED_COLOURS or time.monotonic() > deadline:
            return colours
        time.sleep(0.2)


def wait_for_geometry(window: str, env: Mapping[str, str], width: int, height: int,
                      timeout: float = 10) -> None:
    """Until the X server has ``window`` at ``width`` x ``height`` (a window manager's move and resize
    applied: the app's ConfigureNotify is queued before any later request to it)."""
    def applied() -> bool:
        info = _quiet(["xwininfo", "-id", window], env) or ""
        return (_field(info, "Width"), _field(info, "Height")) == (str(width), str(height))

    _wait(applied, timeout, f"window {window} was not resized to {width}x{height} within {timeout:.0f} s")


def _field(xwininfo: str, name: str) -> str:
    match = re.search(rf"^\s*{re.escape(name)}:\s*(.+)$", xwininfo, re.MULTILINE)
    return match.group(1).strip() if match else ""


def _quiet(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """stdout of ``command``, or None when it failed."""
    done = subprocess.run(list(command), env=dict(env), capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def _wait(ready, seconds: float, message: str) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise SmokeError(message)
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", type=Path, required=True, help="where to write the PNG")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the window")
    parser.add_argument("--title", default=TITLE, help=f"regular expression for the window title ({TITLE})")
    parser.add_argument("--no-keyring", action="store_true", help="no D-Bus session with a Secret Service")
    parser.add_argument("command", nargs="+", help="the app and its arguments (after --)")
    args = parser.parse_args(argv)
    if missing := missing_tools():
        print(f"xcb smoke: missing {', '.join(missing)} (run tools/sysdeps.sh)", file=sys.stderr)
        return 1
    try:
        result = run_app(args.command, args.screenshot, timeout=args.timeout, title=args.title,
                         keyring=not args.no_keyring)
    except SmokeError as err:
        print(f"xcb smoke: FAILED: {err}", file=sys.stderr)
        return 1
    print(f"window '{result.title}' {result.width}x{result.height} {result.map_state}, "
          f"screenshot {args.screenshot} ({result.colours} colours), exit status {result.exit_code}")
    ok = result.map_state == "IsViewable" and result.colours > 16 and result.exit_code == 0
    if not ok:
        print(f"xcb smoke: FAILED\n{result.log}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
