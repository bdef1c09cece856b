"""Start LazyKV Chat: ``python -m lazykv``, ``lazykv`` (GUI) or ``lazykv-cli``.

``python -m lazykv SUBCOMMAND ...`` runs a terminal command from ``lazykv.cli`` instead (``estimate``,
``models``, ``serve``, ...): those never import Qt, so this module imports PySide6 only inside the
functions that start the window.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lazykv import __version__, cli, console
from lazykv.cli import _options
from lazykv.core.engine.engine_check import EngineMissingError, check_engine
from lazykv.core.models.defaults import default_model_path
from lazykv.core.settings import Settings

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication, QWidget

APP_NAME = "LazyKV Chat"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lazykv", description=f"{APP_NAME}: chat with a local GGUF model.", epilog=cli.epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", type=Path, metavar="PATH", help="GGUF model to load (default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--self-test", action="store_true",
        help="check this installation offscreen (engine, Qt, model, lazy cache, snapshots), report, exit",
    )
    parser.add_argument("--version", action="version", version=f"{APP_NAME} {__version__}")
    _options.add_setting_options(parser)  # for this session: the settings saved are not changed
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and cli.is_subcommand(argv[0]):
        return cli.run(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.self_test:
        from lazykv import selftest

        return selftest.run(args.model or default_model_path(), args.n_ctx or selftest.N_CTX)
    try:
        check_engine()
    except EngineMissingError as err:
        return _fail(str(err))

    # imported only now: both import llama_cpp, which check_engine has vouched for
    from lazykv.core.engine.model_load import check_model_file
    from lazykv.core.engine.types import ModelFileError
    from lazykv.core.paths import data_dir
    from lazykv.qt.main_window import MainWindow
    from lazykv.qt.single_instance import SingleInstance

    overrides: dict[str, object] = _options.given(args)
    settings = Settings.load()
    if args.model is not None:
        overrides["model_path"] = str(args.model)
    model = Path(overrides.get("model_path") or settings["model_path"] or default_model_path())
    unavailable = ""  # why the model asked for cannot be opened: said in the window, another is chosen
    try:
        check_model_file(model)
    except ModelFileError as err:
        hint = "; run `make models` to fetch the default model" if model == default_model_path() else ""
        if args.model is not None or model == default_model_path():
            unavailable = f"{err}{hint}"
            overrides.pop("model_path", None)
            print(f"lazykv: {unavailable}", file=sys.stderr)
        else:
            print(f"lazykv: the saved model is gone ({err}); using the default model", file=sys.stderr)
            settings.set("model_path", "")

    app = _application()
    instance = SingleInstance(data_dir(), app)
    if not instance.claim():
        if instance.answered:
            console.say(f"{APP_NAME} is already running; its window was brought forward")
        else:
            console.say(f"{APP_NAME} is already running (it did not answer; it may still be starting)")
        return 0
    if instance.listen_error:
        console.say(f"a second start will not find this window: {instance.listen_error}")
    window = MainWindow(settings, overrides, default_model=default_model_path(), reopen_last=True)
    freeze_start_up_heap()
    instance.activated.connect(lambda: _bring_forward(window))
    app.aboutToQuit.connect(window.shutdown_engine)
    _quit_on_sigint(window)
    window.show()
    if unavailable:
        window.choose_another_model(unavailable)
    else:
        window.open_configured_model()
    code = app.exec()
    clean = window.shutdown_engine()
    instance.release()
    if not clean:  # the engine thread is still inside native code: do not wait on it any longer
        sys.stderr.flush()
        os._exit(code)
    return code


def freeze_start_up_heap() -> None:
    """What start-up built (modules, Qt wrappers, the window, the highlighter's lexers) is never scanned
    by Python's cycle collector again: a full collection of it took 30-50 ms, holding the GIL, so the
    GUI thread stalled whenever a thread that allocates a lot (reading a long conversation) set one off."""
    gc.collect()
    gc.freeze()


def _bring_forward(window: QWidget) -> None:
    """Another start of the app asked for this window."""
    console.say("started again: bringing the window forward")
    window.showNormal()
    window.raise_()
    window.activateWindow()


def _application() -> QApplication:
    from PySide6.QtWidgets import QApplication

    console.hold()  # before any model loads: the engine silences stdout and stderr while it loads one
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(__version__)
    return app


def _quit_on_sigint(window: QWidget) -> None:
    """Ctrl+C in the terminal closes the window (and so frees the engine) instead of aborting."""
    from PySide6.QtCore import QTimer

    signal.signal(signal.SIGINT, lambda *_: window.close())
    # Python runs signal handlers only between bytecodes: let it run a few times a second
    tick = QTimer(window)
    tick.timeout.connect(lambda: None)
    tick.start(250)


def _fail(message: str, code: int = 1) -> int:
    """Report a start-up error on stderr and, when a display is there to show it, in a message box."""
    print(f"lazykv: {message}", file=sys.stderr)
    if _can_show_dialogs():
        from PySide6.QtWidgets import QMessageBox

        _application()
        QMessageBox.critical(None, APP_NAME, message)
    return code


def _can_show_dialogs() -> bool:
    """False where creating a QApplication would abort (no display) or nobody would see a dialog."""
    if os.environ.get("QT_QPA_PLATFORM", "").split(":")[0] in ("offscreen", "minimal"):
        return False
    if sys.platform.startswith("linux") or "bsd" in sys.platform:
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


if __name__ == "__main__":
    sys.exit(main())
