"""A line for the end of the test output (a count the issue's closing note quotes), past pytest's capture."""

from __future__ import annotations

import pytest


def write_summary(config: pytest.Config, line: str) -> None:
    """Print ``line`` on the terminal now, even from a fixture's teardown, where output is captured."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(line)
