"""The window's actions, declared once (as napari's app-model or qutebrowser's commands): each one's title,
keys, menu, toolbar place, when it is enabled and the window's method it calls (or a part's of the
window: ``chat.regenerate`` is the window's ``chat``'s).

The window's menus and toolbar (``build``), their enabled state (``update_enabled``, from the window's
``UiState`` and a check of the window's), Help > Keyboard shortcuts (``shortcut_rows``) and the README's key
list (``python -m lazykv.qt.actions --markdown``; ``--readme README.md`` rewrites it there) all read
``ACTIONS`` and ``WIDGET_KEYS``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QToolBar

from lazykv.qt.ui_state import UiState

if TYPE_CHECKING:
    from PySide6.QtWidgets import QMainWindow

ANY = frozenset(UiState)
IDLE = frozenset({UiState.NO_MODEL, UiState.READY})  # no model being loaded, no reply being written
READY = frozenset({UiState.READY})
REPLYING = frozenset({UiState.REPLYING})

MENUS = ("&File", "&Chat", "&View", "&Help")  # in the menu bar's order


@dataclass(frozen=True)
class ActionSpec:
    """One entry of the window's menus. The window holds its QAction as ``<name>_action`` (a submenu: its
    QMenu as ``<name>_menu``)."""

    name: str
    title: str  # as the menu shows it, with its & mnemonic; "…" when it opens a dialog
    # the window's method it calls, or a part's ("chat.regenerate": the window's ``chat``'s); a checkable
    # one: with the new state; a submenu: as it opens
    handler: str
    menu: str  # one of MENUS
    keys: str = ""  # as the README and Help show them on Linux (QKeySequence's portable text)
    standard: str = ""  # QKeySequence.StandardKey's name: the platform's own binding, ``keys`` on Linux
    tip: str = ""  # status tip and tooltip
    when: frozenset[UiState] = ANY  # the window's states in which it is enabled
    check: str = ""  # the window's (or a part's) method, no arguments, that must also answer True
    toolbar: int = 0  # its place on the toolbar, from 1 (0: not there)
    separator: bool = False  # a separator before it in its menu
    checkable: bool = False
    submenu: bool = False  # a submenu filled by ``handler`` as it opens
    dock: str = ""  # the window's QDockWidget whose own show/hide action this is (no handler, always enabled)

    @property
    def words(self) -> str:
        """The title as a sentence shows it: no mnemonic, no ellipsis."""
        return self.title.replace("&", "").rstrip("…")

    @property
    def attribute(self) -> str:
        return f"{self.name}_menu" if self.submenu else f"{self.name}_action"

    def key_sequences(self) -> list[QKeySequence]:
        """The keys on this platform: a standard key's main binding (e.g. Ctrl+O, or Cmd+O on macOS; none
        where the platform has none, as Windows' scheme for Quit)."""
        if self.standard:
            key = QKeySequence(getattr(QKeySequence.StandardKey, self.standard))
            return [] if key.isEmpty() else [key]
        return [QKeySequence(self.keys)] if self.keys else []


@dataclass(frozen=True)
class WidgetKey:
    """A key a widget handles itself rather than a window action."""

    keys: str
    words: str
    where: str


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("new_private", "New &private chat", "chat.new_private_chat", "&File", "Ctrl+Shift+N",
               tip="A new chat that is never saved (untick Private to end it)", when=IDLE),
    ActionSpec("models", "&Models…", "loading.open_models", "&File", "Ctrl+M", separator=True,
               tip="Models on disk and on the Hugging Face Hub, and what fits"),
    ActionSpec("open", "&Open model…", "loading.choose_model", "&File", "Ctrl+O", "Open", when=IDLE,
               check="engine_free"),
    ActionSpec("recent", "Open &recent", "loading.fill_recent_menu", "&File", submenu=True, when=IDLE,
               check="engine_free"),
    ActionSpec("info", "Model &information…", "loading.show_model_info", "&File", check="has_model"),
    ActionSpec("settings", "&Settings…", "open_settings", "&File", "Ctrl+,", separator=True, when=IDLE,
               check="engine_free", toolbar=5),
    ActionSpec("quit", "&Quit", "close", "&File", "Ctrl+Q", "Quit", separator=True),
    ActionSpec("new_chat", "&New chat", "chat.new_chat", "&Chat", "Ctrl+N", "New", when=IDLE, toolbar=1),
    ActionSpec("stop", "&Stop generating", "chat.stop_reply", "&Chat", "Esc", when=REPLYING),
    ActionSpec("regenerate", "&Regenerate", "chat.regenerate", "&Chat", "Ctrl+R",
               tip="Replace the last reply with a new one", when=READY, check="chat.ends_with_reply",
               toolbar=2),
    ActionSpec("continue", "C&ontinue the reply", "chat.continue_reply", "&Chat", "Ctrl+Shift+R",
               tip="Go on with the last reply where it was cut off", when=READY, check="chat.can_continue",
               toolbar=3),
    ActionSpec("edit_last", "&Edit last message", "chat.edit_last", "&Chat", "Ctrl+E",
               tip="Edit your last message and resend it", when=READY, check="has_user_turn"),
    ActionSpec("copy_reply", "&Copy last reply", "chat.copy_last_reply", "&Chat", "Ctrl+Shift+C",
               check="has_reply"),
    ActionSpec("branch", "&Branch from the last message", "branching.branch_last", "&Chat", "Ctrl+B",
               tip="A new conversation with this one's messages, linked to it (right-click a message to "
               "branch from it)", when=IDLE, check="branching.can_branch"),
    ActionSpec("rename", "Re&name conversation…", "_rename_current", "&Chat", "F2",
               tip="Rename the conversation selected in the list, else the one on screen"),
    ActionSpec("undo_delete", "&Undo delete", "_undo_delete", "&Chat", "Ctrl+Z", "Undo",
               tip="Bring back the conversation deleted last", check="can_undo_delete"),
    ActionSpec("search", "&Search conversations", "_focus_search", "&Chat", "Ctrl+F", "Find"),
    # its tip (to which level it compacts, or why not) is the window's: ChatFlow.update_compact_action
    ActionSpec("compact", "Compact context &memory now", "chat.convert_now", "&Chat", when=READY,
               check="chat.can_compact", toolbar=4),
    ActionSpec("private", "&Private chat (save nothing)", "_set_private", "&Chat", separator=True,
               checkable=True),
    ActionSpec("conversations_dock", "Conversations", "", "&View", dock="conversations_dock"),
    ActionSpec("memory_dock", "Memory", "", "&View", dock="memory_dock", toolbar=6),
    ActionSpec("shortcuts", "&Keyboard shortcuts", "_show_shortcuts", "&Help", "Ctrl+/"),
    ActionSpec("about", "&About LazyKV Chat", "_show_about", "&Help",
               tip="The app's version, the engine's and the backend it was built for"),
)
ACTIONS_BY_NAME = {spec.name: spec for spec in ACTIONS}

WIDGET_KEYS: tuple[WidgetKey, ...] = (
    WidgetKey("Enter", "Send the message", "message box"),
    WidgetKey("Shift+Enter", "New line in the message", "message box"),
    WidgetKey("Esc", "Leave editing a message", "message box"),
    WidgetKey("Del", "Delete the selected conversation", "conversation list"),
)


def resolve(window: object, name: str) -> Any:
    """A handler's or check's method by its declared name: the window's, or its part's ("chat.regenerate")."""
    return functools.reduce(getattr, name.split("."), window)


def build(window: QMainWindow) -> dict[str, QAction]:
    """The window's menus and toolbar from ``ACTIONS``, each action connected to its handler and set as the
    window's ``<name>_action`` (``<name>_menu``). Returns the actions by name (a submenu's menuAction)."""
    menus = {title: window.menuBar().addMenu(title) for title in MENUS}
    made: dict[str, QAction] = {}
    for spec in ACTIONS:
        menu = menus[spec.menu]
        if spec.separator:
            menu.addSeparator()
        if spec.submenu:
            sub = menu.addMenu(spec.title)
            sub.aboutToShow.connect(resolve(window, spec.handler))
            setattr(window, spec.attribute, sub)
            made[spec.name] = sub.menuAction()
            continue
        action = _action(window, spec)
        menu.addAction(action)
        made[spec.name] = action
    toolbar = QToolBar("Main", window)
    toolbar.setObjectName("main-toolbar")
    toolbar.setMovable(False)
    for spec in sorted((s for s in ACTIONS if s.toolbar), key=lambda s: s.toolbar):
        toolbar.addAction(made[spec.name])
    window.addToolBar(toolbar)
    return made


def _action(window: QMainWindow, spec: ActionSpec) -> QAction:
    if spec.dock:
        action = getattr(window, spec.dock).toggleViewAction()
    else:
        action = QAction(spec.title, window)
        action.setObjectName(f"{spec.name}-action")
        if spec.checkable:
            action.setCheckable(True)
            action.toggled.connect(resolve(window, spec.handler))
        else:
            action.triggered.connect(resolve(window, spec.handler))
        setattr(window, spec.attribute, action)
    action.setShortcuts(spec.key_sequences())
    if spec.tip:
        action.setStatusTip(spec.tip)
        action.setToolTip(spec.tip)
    return action


def enabled(window: object, spec: ActionSpec, state: UiState) -> bool:
    """Whether ``spec`` is open in ``state``: its states, then the window's check."""
    return state in spec.when and (not spec.check or bool(resolve(window, spec.check)()))


def update_enabled(window: QMainWindow, state: UiState) -> None:
    """Every declared action (a submenu: its menu) enabled as its declaration says for ``state``."""
    for spec in ACTIONS:
        if not spec.dock:
            getattr(window, spec.attribute).setEnabled(enabled(window, spec, state))


def shortcut_rows() -> list[tuple[str, str, str]]:
    """(what it does, this platform's keys, where) for every action with keys, then the widgets' keys."""
    rows = []
    for spec in ACTIONS:
        keys = ", ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in spec.key_sequences())
        if keys:
            rows.append((spec.words, keys, f"{spec.menu.replace('&', '')} menu"))
    return rows + [(key.words, key.keys, key.where.capitalize()) for key in WIDGET_KEYS]


README_BEGIN = ("<!-- keys: written by `python -m lazykv.qt.actions --readme README.md` from "
                "app/lazykv/qt/actions.py -->")
README_END = "<!-- /keys -->"
README_INDENT = "  "  # the list sits in a bullet of the README's feature list


def markdown() -> str:
    """The README's key list: one line per declared key, as on Linux, in the menus' order, then the
    widgets' keys."""
    lines = [f"- {spec.keys}: {spec.words} ({spec.menu.replace('&', '')} menu)"
             for spec in ACTIONS if spec.keys]
    lines += [f"- {key.keys}: {key.words} (in the {key.where})" for key in WIDGET_KEYS]
    return "\n".join(README_INDENT + line for line in lines) + "\n"


def readme_block(text: str) -> str:
    """The key list between the README's markers (ValueError when they are missing)."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the README has no key list between {README_BEGIN!r} and {README_END!r}")
    start = text.index("\n", begin) + 1
    return text[start:text.rindex("\n", 0, end) + 1]


def write_readme(path: Path) -> bool:
    """Rewrite the key list in the README at ``path``; whether it changed."""
    text = path.read_text(encoding="utf-8")
    old = readme_block(text)
    start = text.index("\n", text.find(README_BEGIN)) + 1
    new = text[:start] + markdown() + text[start + len(old):]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazykv.qt.actions",
                                     description="The window's keys, from the actions' declaration.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the README's key list")
    group.add_argument("--readme", type=Path, metavar="PATH", help="rewrite the key list in this README")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    try:
        changed = write_readme(args.readme)
    except (OSError, ValueError) as err:
        print(f"The README's key list was not written: {err}", file=sys.stderr)
        return 1
    print(f"{args.readme}: key list {'rewritten' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
