"""The app from the source tree on a real X server: Qt's xcb platform, Xvfb, the openbox window manager.

Every other GUI test runs offscreen, which needs none of the libraries the xcb plugin links: this
one is what notices a machine (or a `tools/sysdeps.sh`) that cannot show the window on a desktop.
The X tools are set-up requirements (`make sysdeps`): missing ones fail the test, never skip it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tools import xcb_smoke

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_app_shows_its_window_under_xcb_and_closes_cleanly(
    tmp_path: Path, smollm2_path: Path
) -> None:
    missing = xcb_smoke.missing_tools()
    assert not missing, f"missing {missing}: run tools/sysdeps.sh"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), os.environ.get("PYTHONPATH", "")]),
           "QT_QPA_PLATFORM": "offscreen"}  # as `make test` sets it: the smoke run must override it
    shot = tmp_path / "xcb-source.png"

    result = xcb_smoke.run_app(
        [sys.executable, "-m", "lazykv", "--model", str(smollm2_path), "--ctx", "512"], shot, env=env,
        title=r"SmolLM2.* — LazyKV Chat",  # the model has loaded
    )

    assert result.map_state == "IsViewable", result.log
    assert result.width >= 640 and result.height >= 400, (result.width, result.height)
    assert result.colours > xcb_smoke.PAINTED_COLOURS, "the screenshot is blank"
    assert "qt.qpa" not in result.log and "platform plugin" not in result.log, result.log
    assert result.exit_code == 0, result.log


@pytest.mark.slow
def test_size_and_position_set_through_the_window_manager_are_kept(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Resized and moved as a user would (the window manager's request), closed, started again."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "lazykv", "--model", str(smollm2_path), "--ctx", "512"]

    def move_and_resize(window: str, x_env: dict[str, str]) -> None:
        subprocess.run(["wmctrl", "-i", "-r", window, "-e", "0,120,90,900,560"], env=x_env, check=True)
        xcb_smoke.wait_for_geometry(window, x_env, 900, 560)

    keyrings = tmp_path / "keyrings"  # one user's keyring across both sessions
    first = xcb_smoke.run_app(command, tmp_path / "first.png", env=env, keyring_dir=keyrings,
                              before_close=move_and_resize)
    assert first.exit_code == 0, first.log
    second = xcb_smoke.run_app(command, tmp_path / "second.png", env=env, keyring_dir=keyrings)
    assert (second.width, second.height) == (900, 560), second.log
    assert 120 <= second.x <= 140 and 90 <= second.y <= 130, (second.x, second.y)  # inside the frame
    assert second.exit_code == 0, second.log


@pytest.mark.slow
def test_without_a_keyring_nothing_modal_keeps_the_window_from_closing(tmp_path: Path) -> None:
    """No Secret Service on the desktop: the app says so in a banner, and the title bar's close
    button closes it (a window-modal question used to swallow the close)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "app"), os.environ.get("PYTHONPATH", "")]),
           "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent"}  # no D-Bus session: no keyring
    result = xcb_smoke.run_app([sys.executable, "-m", "lazykv"], tmp_path / "no-keyring.png", env=env,
                               keyring=False, timeout=30)
    assert result.map_state == "IsViewable", result.log
    assert result.exit_code == 0, result.log
