"""The house keeps its rooms small (issue 24): no module of the app is over 600 lines."""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
MAX_LINES = 600


def test_no_file_in_the_app_is_over_600_lines() -> None:
    sizes = {path.relative_to(APP).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in APP.rglob("*.py")}
    assert len(sizes) > 50  # the app's modules were found
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
