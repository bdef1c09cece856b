"""The real app, driven as a user would, on a real X server: ``python -m tests.support.xcb_app SCENARIO
OUT.json -- [app arguments]``.

Starts LazyKV Chat through its own entry point (``lazykv.__main__.main``: the real settings, data
folders, engine and model, the start-up path included) and, once its event loop runs, plays
SCENARIO on its window: keys typed into the focused widget, clicks on the list's rows and the
Private box, Ctrl+Q to quit (Qt's test events, delivered to the widgets of a window mapped by the
window manager). What the scenario saw is written to OUT.json as one object; an ``error`` key
says why it stopped early. Run it on a display (``tools/xcb_smoke.x_desktop``) with
``QT_QPA_PLATFORM=xcb``; the settings and data folders come from ``LAZYKV_CONFIG_DIR`` and
``LAZYKV_DATA_DIR``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEventLoop, QPoint, Qt, QTimer
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QDialog, QLabel, QLineEdit, QPushButton

from lazykv import __main__ as entry

WAIT_S = 90.0  # a real model on a busy machine


def wait_until(ready: Callable[[], bool], what: str, seconds: float = WAIT_S) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}")
        QApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        time.sleep(0.005)


def pause(ms: int) -> None:
    deadline = time.monotonic() + ms / 1000
    while time.monotonic() < deadline:
        QApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        time.sleep(0.005)


class Driver:
    """The window of the app under test, and what a user does to it."""

    def __init__(self) -> None:
        from lazykv.qt.main_window import MainWindow

        windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
        assert len(windows) == 1, windows
        self.w = windows[0]
        QTest.qWaitForWindowExposed(self.w, 10_000)
        self.replies: list[Any] = []
        self.w.reply_finished.connect(self.replies.append)
        self.opened: list[tuple[int, Any]] = []
        self.w.conversations.opened.connect(lambda conv_id, result: self.opened.append((conv_id, result)))

    # -- waiting ---------------------------------------------------------------------------------------

    def model_loaded(self) -> None:
        wait_until(lambda: self.w.model_info is not None and self.w.state.name == "READY", "the model")

    def settled(self) -> None:
        """Nothing in flight: engine requests, database jobs, a resume."""
        wait_until(lambda: self.w.ops.count == 0 and self.w.conversations.resume is None
                   and self.w.state.name in ("READY", "NO_MODEL"), "the app to settle")

    def listed(self, n: int) -> None:
        wait_until(lambda: len(self.w.conversations_panel.ids()) >= n, f"{n} conversations listed")

    # -- input ------------------------------------------------------------------------------------------

    def send(self, text: str) -> dict[str, Any]:
        """Type ``text`` into the message box and press Enter; wait for the reply and its saves. What the
        model was sent, and how the reply went."""
        self.w.input.setFocus()
        QTest.keyClicks(self.w.input, text)
        before = len(self.replies)
        QTest.keyClick(self.w.input, Qt.Key.Key_Return)
        request = self.w.chat.reply_request
        assert request is not None, "Enter did not start a reply"
        prompt = [dict(m) for m in request.messages]
        wait_until(lambda: len(self.replies) > before, f"the reply to {text!r}")
        self.settled()
        result = self.replies[-1]
        return {"prompt": prompt, "n_prompt": result.n_prompt, "n_reused": result.n_reused}

    def click_row(self, conv_id: int) -> None:
        panel = self.w.conversations_panel
        row = panel.ids().index(conv_id)
        item = panel.list.item(row)
        panel.list.scrollToItem(item)
        QTest.mouseClick(panel.list.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         panel.list.visualItemRect(item).center())

    def click_private(self) -> None:
        box = self.w.conversations_panel.private_box
        QTest.mouseClick(box, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         QPoint(8, box.height() // 2))  # on the tick box itself

    def click_button(self, name: str) -> None:
        """Click the button of that object name once it is shown (in a dialog of the window)."""
        def shown() -> list[QPushButton]:
            return [b for b in self.w.findChildren(QPushButton, name) if b.isVisible()]

        wait_until(lambda: bool(shown()), f"{name} shown")
        button = shown()[0]
        QTest.mouseClick(button, Qt.MouseButton.LeftButton)

    def windows(self) -> list[dict[str, Any]]:
        """What is shown: each visible top-level window of the app (Qt's view), and the titles of the
        windows the window manager lists (``wmctrl -l``: what a user could see or switch to)."""
        shown = [{"class": w.metaObject().className(), "name": w.objectName(), "title": w.windowTitle(),
                  "labels": [label.text() for label in w.findChildren(QLabel) if label.isVisible()]
                  if w is not self.w else []}  # a dialog's words (the main window holds its dialogs)
                 for w in QApplication.topLevelWidgets() if w.isWindow() and w.isVisible()]
        listed = subprocess.run(["wmctrl", "-l"], capture_output=True, text=True, timeout=10).stdout
        return [*shown, {"wm": [line.split(None, 3)[-1] for line in listed.splitlines() if line.strip()]}]

    def quit(self) -> None:
        """Ctrl+Q, as a user quits."""
        self.w.activateWindow()
        QTest.keyClick(self.w, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)

    # -- what is shown, saved and sent ------------------------------------------------------------

    def screen(self) -> dict[str, Any]:
        """The chat on screen: the transcript, the row the list highlights, the saved id, the notes."""
        panel = self.w.conversations_panel
        return {
            "current": self.w.conversations.current,
            "selected": panel.selected_id(),
            "highlighted": [panel.ids()[i.row()] for i in panel.list.selectedIndexes()],
            "messages": [dict(m) for m in self.w.conversation.messages()],
            "transcript": self.w.transcript.toPlainText(),
            "resume_note": self.w.chat.resume_note,
            "status": self.w.statusBar().currentMessage(),
            "private": self.w.conversations.private,
        }

    def saved(self) -> dict[str, list[dict[str, str]]]:
        """Every saved conversation's messages, by id (through the app's own database connection)."""
        def read(store: Any) -> dict[str, list[dict[str, str]]]:
            return {str(s.id): store.conversation(s.id).messages for s in store.list_conversations()}

        return self.w.database.call(read)


# -- scenarios: each returns what it saw ------------------------------------------------------------

def two_chats_open_the_older(d: Driver) -> dict[str, Any]:
    """Two saved chats; the older one opened again from the list (its snapshot resumed); Ctrl+Q."""
    d.model_loaded()
    d.settled()
    d.send("Name a colour.")
    older = d.w.conversations.current
    QTest.keyClick(d.w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # New chat
    d.settled()
    d.send("Name a fruit.")
    newer = d.w.conversations.current
    d.listed(2)
    d.click_row(older)
    wait_until(lambda: any(conv_id == older for conv_id, _ in d.opened), "the older chat to resume")
    d.settled()
    return {"older": older, "newer": newer, "screen": d.screen()}


def observe_start(d: Driver) -> dict[str, Any]:
    """A relaunch: what the window lands on once the model has loaded and the start-up settled."""
    d.model_loaded()
    pause(500)
    d.settled()
    wait_until(lambda: bool(d.w.chat.resume_note) or d.w.conversations.current is not None or
               len(d.w.conversations_panel.ids()) > 0, "the list", 30)
    pause(1500)  # an open the start-up chose would be under way by now
    d.settled()
    return {"screen": d.screen()}


def private_then_not(d: Driver) -> dict[str, Any]:
    """A saved chat; Private ticked, a turn; Private unticked, "hello again"."""
    d.model_loaded()
    d.settled()
    d.send("Tell me a very short story about a dragon called Zorblax.")
    story = d.w.conversations.current
    d.click_private()
    wait_until(lambda: d.w.conversations.private, "Private to be on")
    d.send("Make the dragon purple.")
    d.click_private()
    d.click_button("discard-private-chat")  # "End the private chat?" Discard
    wait_until(lambda: not d.w.conversations.private, "Private to be off")
    d.settled()
    hello = d.send("hello again")
    d.settled()
    return {"story": story, "hello": hello, "screen": d.screen(), "saved": d.saved()}


def wrong_then_right_passphrase(d: Driver) -> dict[str, Any]:
    """A passphrase chosen before (the test set it): a wrong one typed into the prompt at start, Enter;
    then the right one typed into whatever has the focus, Enter."""
    prompts = d.w.findChildren
    wait_until(lambda: any(w.isVisible() for w in prompts(QDialog, "passphrase-dialog")), "the prompt")
    QTest.qWait(300)
    QTest.keyClicks(QApplication.focusWidget(), "wrong horse")
    QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
    wait_until(lambda: d.w.ops.count == 0, "the wrong passphrase to be checked")
    pause(1000)  # a second window would be up by now
    focus = QApplication.focusWidget()
    after_wrong = {"windows": d.windows(), "focus": type(focus).__name__,
                   "focus_window": focus.window().objectName() if focus is not None else None,
                   "selected": focus.selectedText() if isinstance(focus, QLineEdit) else None,
                   "focus_text": focus.text() if isinstance(focus, QLineEdit) else None}
    QTest.keyClicks(focus, "correct horse")  # over the selection
    QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_Return)
    wait_until(lambda: d.w.conversations.snapshots_on, "the right passphrase to be taken", 30)
    d.settled()
    pause(1000)  # a stale window would still be up
    return {"after_wrong": after_wrong, "after_right": {"windows": d.windows()}}


def switch_during_reread(d: Driver) -> dict[str, Any]:
    """Two saved chats without snapshots (the test wrote them): one clicked, and while its transcript is
    re-read, the other; then a message sent."""
    d.model_loaded()
    d.settled()
    d.listed(2)
    panel = d.w.conversations_panel
    by_title = {panel.title(conv_id): conv_id for conv_id in panel.ids()}
    long_id, short_id = by_title["A long chat"], by_title["A short chat"]
    if d.w.conversations.current != short_id:
        d.click_row(short_id)
        wait_until(lambda: d.w.conversations.current == short_id, "the short chat")
        d.settled()
    d.click_row(long_id)
    wait_until(lambda: d.w.conversations.resume is not None, "the re-read to start")
    pause(300)
    during = d.w.state.name
    d.click_row(short_id)
    pause(300)
    d.settled()
    shown = d.screen()
    sent = d.send("Which chat is this?")
    return {"long": long_id, "short": short_id, "state_during": during, "screen": shown,
            "after_send": d.screen(), "sent": sent, "saved": d.saved()}


SCENARIOS: dict[str, Callable[[Driver], dict[str, Any]]] = {
    f.__name__: f for f in (two_chats_open_the_older, observe_start, private_then_not, switch_during_reread,
                            wrong_then_right_passphrase)
}


def main(argv: list[str]) -> int:
    scenario, out = SCENARIOS[argv[0]], Path(argv[1])
    app_args = argv[3:] if len(argv) > 2 and argv[2] == "--" else argv[2:]
    app = entry._application()  # the app's own QApplication (main() takes the one that exists)

    def play() -> None:
        answer: dict[str, Any]
        driver = None
        try:
            driver = Driver()
            answer = scenario(driver)
        except Exception as err:  # noqa: BLE001 - reported to the test, which fails with it
            answer = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            if driver is not None:
                answer["screen"] = driver.screen()
        out.write_text(json.dumps(answer, indent=1, default=str))
        if driver is not None:
            driver.quit()
            QTimer.singleShot(5000, driver.w.close)  # in case a dialog held Ctrl+Q
            QTimer.singleShot(15_000, app.quit)
        else:
            app.quit()

    QTimer.singleShot(0, play)
    return entry.main(app_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
