"""The Qt binding itself: a broken PySide6 build crashes the app long after the cause."""

from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QPainterPath


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 (PEP 683)")
def test_void_calls_keep_the_reference_count_of_none() -> None:
    """PySide6 6.12.0 returned None without a reference from void methods on Python 3.11: after
    enough calls (a few seconds of painting the memory graph) the process died in none_dealloc."""
    path = QPainterPath()
    before = sys.getrefcount(None)
    for _ in range(1000):
        path.lineTo(QPointF(1.0, 2.0))
    assert sys.getrefcount(None) - before > -100
