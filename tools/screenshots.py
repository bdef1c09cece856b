"""Render the app's main states to PNG under docs/ (``make screenshots``): real engine, real model.

chatting (with the context indicator), a Markdown reply with code, the dark theme, conversion in
progress, the memory panel after the conversion, the settings dialog, a relaunch that lands on the
chat open at quit (its snapshot resumed); then the ladder: the settings
with a context memory budget, and one conversation on each of its steps (16-bit, 8-bit, 4-bit) and
while it is compacted to 4-bit; the Models page (``python tools/screenshots.py models``: that one
alone, no model loaded); a tree of branches in the list (``python tools/screenshots.py branches``: that
one alone, also taken by the whole run). Runs on Qt's real xcb
platform under a private Xvfb display with a window manager (tools/xcb_smoke.py) when those are
installed, else offscreen; settings and conversations go to temporary dirs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QEventLoop, QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication, QWidget

if TYPE_CHECKING:
    from lazykv.core.engine.engine import StepEvent

DOCS = Path(__file__).resolve().parent.parent / "docs"
TIMEOUT_MS = 120_000


class OnGuiThread(QObject):
    """Receives a worker signal queued on the GUI thread (a bare function would run on the worker's)."""

    fired = Signal(object)

    def __init__(self, signal) -> None:  # noqa: ANN001 - a Qt signal
        super().__init__()
        self._signal = signal
        signal.connect(self._relay)

    def detach(self) -> None:
        self._signal.disconnect(self._relay)

    def _relay(self, *args: object) -> None:
        self.fired.emit(args)


def wait_for(signal, predicate=lambda *a: True) -> tuple:  # noqa: ANN001 - a Qt signal
    """Run the event loop until ``signal`` fires with arguments passing ``predicate``."""
    loop, got, relay = QEventLoop(), [], OnGuiThread(signal)

    def fired(args: tuple) -> None:
        if predicate(*args) and not got:
            got.append(args)
            loop.quit()

    relay.fired.connect(fired)
    QTimer.singleShot(TIMEOUT_MS, loop.quit)
    loop.exec()
    relay.detach()
    if not got:
        raise TimeoutError("the app did not get there in time")
    return got[0]


def pause(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def shoot(widget: QWidget, name: str) -> None:
    path = DOCS / name
    widget.grab().save(str(path))
    print(f"wrote {path}")


def main() -> int:
    os.environ["LAZYKV_CONFIG_DIR"] = tempfile.mkdtemp(prefix="lazykv-shots-")
    os.environ["LAZYKV_DATA_DIR"] = tempfile.mkdtemp(prefix="lazykv-shots-data-")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import xcb_smoke

    shots = {"models": shoot_models, "branches": shoot_branches_alone}.get(" ".join(sys.argv[1:]), shoot_all)
    if xcb_smoke.missing_tools():
        print(f"screenshots: offscreen ({', '.join(xcb_smoke.missing_tools())} missing)")
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        return shots()
    with xcb_smoke.x_desktop() as display:
        os.environ.update(DISPLAY=display, QT_QPA_PLATFORM="xcb")
        return shots()


def shoot_all() -> int:
    from lazykv.__main__ import default_model_path
    from lazykv.core.settings import Settings
    from lazykv.qt import theme
    from lazykv.qt.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LazyKV Chat")
    settings = Settings()
    for name, value in {"n_ctx": 1024, "temperature": 0.0, "seed": 7, "max_reply_tokens": 60,
                        "snapshot_encryption": "none"}.items():
        settings.set(name, value)
    window = MainWindow(settings, default_model=default_model_path())
    window.resize(1180, 760)
    window.show()
    window.open_configured_model()
    wait_for(window.model_loaded)
    window.demo_notice.hide()  # the pictures show the chat; the demo model's note is the Models page's story

    window.system_edit.setText("You are a friendly assistant. Answer briefly.")
    window.system_edit.editingFinished.emit()
    window.chat.send_text("What is a KV cache in a language model, in two sentences?")
    wait_for(window.reply_finished)
    pause(300)
    shoot(window, "screenshot-chatting.png")

    window.settings.set("max_reply_tokens", 160)
    window.chat.send_text("Write a short Python function that reverses a string, in a code block, "
                     "then one sentence about it.")
    wait_for(window.reply_finished)
    pause(300)
    shoot(window, "screenshot-markdown.png")
    theme.apply(app, "dark")
    pause(300)
    shoot(window, "screenshot-dark.png")
    theme.apply(app, "system")
    window.chat.new_chat()
    pause(200)

    # a long message crosses the 512-cell f16 view: grab the window while the banner shows progress
    window.settings.set("max_reply_tokens", 40)
    shots: list[bool] = []

    def during(event: StepEvent) -> None:
        if event.stage == "progress" and event.fraction >= 0.4 and not shots:
            shots.append(True)
            shoot(window, "screenshot-converting.png")

    window.step_shown.connect(during)  # after the window's own handler: the banner is set
    items = ", ".join(f"item {i}" for i in range(110))
    window.chat.send_text(f"Here is a list: {items}. Which item comes last?")
    wait_for(window.reply_finished)
    window.step_shown.disconnect(during)
    pause(1200)
    shoot(window.memory_dock, "screenshot-memory.png")

    window.settings_action.trigger()
    pause(300)
    shoot(window.settings_dialog, "screenshot-settings.png")
    window.settings_dialog.reject()
    window = shoot_relaunch(window)
    ladder_shots = shoot_ladder(window)
    shoot_branches(window)
    window.close()
    pause(200)  # let the closed dialog's deferred delete run while Qt is still up
    return 0 if shots and ladder_shots and shoot_models() == 0 else 1


def shoot_relaunch(window):  # noqa: ANN001, ANN201 - a MainWindow in, the relaunched one out
    """The first chat opened again (not the newest), the app quit and started again as it starts: the
    new window lands on that chat, its snapshot resumed, and says so."""
    from lazykv.__main__ import default_model_path
    from lazykv.core.settings import Settings
    from lazykv.qt.main_window import MainWindow

    first = window.conversations_panel.ids()[-1]  # the oldest: the KV cache question
    window.conversations.open(first)
    wait_for(window.conversations.opened)
    pause(300)
    window.close()  # remembers the chat on screen
    pause(300)
    relaunched = MainWindow(Settings.load(), default_model=default_model_path(), reopen_last=True)
    relaunched.resize(1180, 760)
    relaunched.show()
    relaunched.open_configured_model()
    wait_for(relaunched.conversations.opened)
    relaunched.demo_notice.hide()  # as in the other chat pictures
    pause(300)
    shoot(relaunched, "screenshot-relaunch.png")
    return relaunched


def shoot_branches_alone() -> int:
    from lazykv.__main__ import default_model_path
    from lazykv.core.settings import Settings
    from lazykv.qt.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LazyKV Chat")
    settings = Settings()
    for name, value in {"n_ctx": 1024, "temperature": 0.0, "seed": 7, "snapshot_encryption": "none"}.items():
        settings.set(name, value)
    window = MainWindow(settings, default_model=default_model_path())
    window.resize(1180, 760)
    window.show()
    window.open_configured_model()
    wait_for(window.model_loaded)
    window.demo_notice.hide()
    shoot_branches(window)
    window.close()
    pause(200)
    return 0


def shoot_branches(window) -> None:  # noqa: ANN001 - a MainWindow
    """A chat of three exchanges branched twice (at its first reply, and at its second), one branch taken
    further; the list shows the tree, the branch on screen says it came from its parent's cache."""
    window.settings.set("max_reply_tokens", 40)
    window.chat.new_chat()
    pause(200)
    for text in ("Suggest a name for a sailing boat.", "Why that name?", "Suggest a colour for its sail."):
        window.chat.send_text(text)
        wait_for(window.reply_finished)
    pause(300)
    parent = window.conversations.current
    for index in (3, 1):  # the second reply, then the first (each branch opens on screen)
        if window.conversations.current != parent:
            window.conversations.open(parent)
            wait_for(window.conversations.opened)
        window.branching.branch_from(index)
        wait_for(window.conversations.opened)
    window.chat.send_text("Suggest a name for a rowing boat instead.")
    wait_for(window.reply_finished)
    pause(1200)
    shoot(window, "screenshot-branches.png")


def shoot_models() -> int:
    """The Models page on what this machine has (the models `make models` fetched at least), the fit
    at 8,192 tokens in the ladder; the Hub tab needs the network, so it is not in the picture."""
    from lazykv.core.settings import Settings
    from lazykv.qt.models_dialog import DISK_FIT, ModelsDialog

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("LazyKV Chat")
    settings = Settings()
    settings.set("n_ctx", 8192)
    settings.set("kv_mode", "ladder")
    dialog = ModelsDialog(settings)
    dialog.resize(1300, 500)
    dialog.show()
    loop = QEventLoop()
    QTimer.singleShot(TIMEOUT_MS, loop.quit)
    poll = QTimer()
    table = dialog.disk_table

    def planned() -> bool:  # scanned, and every fit column filled in (planned off the GUI thread)
        return dialog.rescan_button.isEnabled() and table.rowCount() > 0 and all(
            table.item(r, DISK_FIT).text() != "planning…" for r in range(table.rowCount()))

    poll.timeout.connect(lambda: planned() and loop.quit())
    poll.start(50)
    loop.exec()
    poll.stop()
    found = dialog.disk_table.rowCount()
    if found:
        dialog.disk_table.selectRow(0)
    pause(300)
    shoot(dialog, "screenshot-models.png")
    dialog.close()
    pause(200)
    return 0 if found else 1


LADDER_BUDGET_MB = 13  # SmolLM2's ladder cache: 6,480 bytes a token, 2,048 tokens in 13 MiB


def shoot_ladder(window) -> bool:  # noqa: ANN001 - a MainWindow
    """The ladder chosen by memory budget in Settings, then a conversation that fills its 16-bit step
    (512 cells), goes on on its 8-bit step (1,024), is compacted to 4-bit with "Compact context memory
    now" and answers there; False if the 4-bit step's progress was not seen."""
    window.settings_action.trigger()
    dialog = window.settings_dialog
    dialog.set_value("kv_mode", "ladder")
    dialog.set_value("context_budget_mb", LADDER_BUDGET_MB)
    pause(300)
    shoot(dialog, "screenshot-ladder-settings.png")
    dialog.accept()
    wait_for(window.model_loaded)
    window.chat.new_chat()
    pause(200)
    window.chat.send_text("What is a KV cache in a language model, in two sentences?")
    wait_for(window.reply_finished)
    pause(300)
    shoot(window, "screenshot-ladder-f16.png")

    items = ", ".join(f"item {i}" for i in range(110))  # ~600 tokens: past the 16-bit step
    window.chat.send_text(f"Here is a list: {items}. Which item comes last?")
    wait_for(window.reply_finished)
    pause(1200)
    shoot(window, "screenshot-ladder-8bit.png")

    shots: list[bool] = []

    def during(event: StepEvent) -> None:
        if event.target == "q4_0" and event.stage == "progress" and event.fraction >= 0.4 and not shots:
            shots.append(True)
            shoot(window, "screenshot-ladder-converting.png")

    window.step_shown.connect(during)
    window.compact_action.trigger()  # "Compact context memory now": one step, to 4-bit
    wait_for(window.converted)
    window.step_shown.disconnect(during)
    pause(300)
    window.chat.send_text("Which item comes first?")
    wait_for(window.reply_finished)
    pause(1200)
    shoot(window, "screenshot-ladder-4bit.png")
    return bool(shots)


if __name__ == "__main__":
    sys.exit(main())
