"""A process that claims the single-instance lock (run by test_single_instance in child processes).

``python -m tests.qt.instance_probe DATA_DIR``: prints ``first`` and waits to be activated
(then prints ``activated`` and exits 0), or prints ``second`` and exits 3 when another
process holds the lock.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QTimer

from lazykv.qt.single_instance import SingleInstance

SECOND = 3
WAIT_MS = 20_000


def main(data_dir: Path) -> int:
    app = QCoreApplication([sys.argv[0]])
    instance = SingleInstance(data_dir)
    if not instance.claim():
        print("second", flush=True)
        return SECOND
    print("first", flush=True)

    def activated() -> None:
        print("activated", flush=True)
        app.quit()

    instance.activated.connect(activated)
    QTimer.singleShot(WAIT_MS, lambda: app.exit(1))
    code = app.exec()
    instance.release()
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
