"""``lazykv --self-test``: prove an installed app (above all a frozen bundle) works, then exit.

Runs offscreen in a temporary config/data dir, so it never touches the user's settings or
conversations: loads the engine (the bundled native libraries), builds the main window once
(the bundled Qt plugins) and renders the app icon (resources/), loads the model with the lazy
cache, generates a few tokens, forces the conversion to q8_0, generates again, saves the
conversation's snapshot, restores it into an emptied cache and replies from it. Prints a short
report with the time from process start to the first window and to the first token; exits 0
when every step worked, else 1 with the step that failed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lazykv import __version__
from lazykv.resources import APP_ICON, resource

if TYPE_CHECKING:  # llama_cpp is imported only once check_engine has vouched for it
    from lazykv.core.engine.engine import EngineSession

N_CTX = 2048
MAX_TOKENS = 8
WINDOW_TIMEOUT_S = 20.0
T0_ENV = "LAZYKV_T0"  # a launcher that measures start-up sets it to its time.time() before starting us
# the platform plugin a desktop session needs, per OS (offscreen alone would hide a broken bundle)
NATIVE_PLATFORM_PLUGINS = {"linux": ("xcb", "wayland"), "win32": ("windows",), "darwin": ("cocoa",)}


class SelfTestError(Exception):
    """A step failed; the message says which and why."""


def process_start_time() -> float:
    """When this process started (epoch seconds): ``LAZYKV_T0`` if set, else from /proc, else now."""
    if os.environ.get(T0_ENV):
        return float(os.environ[T0_ENV])
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started_after_boot = int(stat[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (uptime - started_after_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


def run(model: Path, n_ctx: int = N_CTX) -> int:
    origin = process_start_time()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    frozen = getattr(sys, "frozen", False)
    where = f"frozen bundle {sys.executable}" if frozen else f"source, {sys.executable}"
    print(f"LazyKV Chat {__version__} self-test ({where})", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="lazykv-selftest-") as tmp:
            os.environ["LAZYKV_CONFIG_DIR"] = str(Path(tmp) / "config")
            os.environ["LAZYKV_DATA_DIR"] = str(Path(tmp) / "data")
            first_window, first_token = _run_steps(model, n_ctx, Path(tmp), origin)
    except SelfTestError as err:
        print(f"self-test FAILED: {err}", flush=True)
        return 1
    print(f"times: first_window={first_window:.3f} first_token={first_token:.3f}")
    print("self-test passed", flush=True)
    return 0


def _report(label: str, text: str) -> None:
    print(f"  {label:<14}{text}", flush=True)


def _run_steps(model: Path, n_ctx: int, tmp: Path, origin: float) -> tuple[float, float]:
    engine_version, lib_dir = _check_engine()
    _report("engine", f"llama_cpp {engine_version} (native libraries in {lib_dir})")
    _check_model(model)
    _report("model", f"{model} ({model.stat().st_size / 2**20:.0f} MiB)")
    first_window = _check_window(model, tmp, origin)
    first_token = _check_engine_session(model, n_ctx, tmp, origin)
    return first_window, first_token


def _check_engine() -> tuple[str, Path]:
    from lazykv.core.engine.engine_check import EngineMissingError, check_engine

    try:
        info = check_engine()
    except EngineMissingError as err:
        raise SelfTestError(f"engine: {err}") from err
    import llama_cpp

    return info.version, Path(llama_cpp.__file__).resolve().parent / "lib"


def _check_model(model: Path) -> None:
    from lazykv.core.engine.model_load import check_model_file
    from lazykv.core.engine.types import ModelFileError

    try:
        check_model_file(model)
    except ModelFileError as err:
        raise SelfTestError(f"model: {err}; `make models` fetches the default model") from err


def _check_window(model: Path, tmp: Path, origin: float) -> float:
    """Build and show the main window offscreen; seconds from process start until it was exposed."""
    import PySide6
    from PySide6.QtCore import QLibraryInfo
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from lazykv.core.settings import Settings
    from lazykv.qt.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    settings = Settings(tmp / "config" / "settings.json")
    settings.set("snapshot_encryption", "none")  # no OS keyring prompt
    window = MainWindow(settings, {}, default_model=model)
    window.show()
    _wait(app.processEvents, lambda: window.windowHandle() is not None and window.windowHandle().isExposed(),
          WINDOW_TIMEOUT_S, "the main window was not shown")
    if window.grab().isNull():
        raise SelfTestError("qt: the main window did not render")
    first_window = time.time() - origin
    plugins = _platform_plugins(Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)))
    _report("qt", f"PySide6 {PySide6.__version__}, platform {app.platformName()}, "
            f"platform plugins: {', '.join(plugins) or 'none'}")
    native = NATIVE_PLATFORM_PLUGINS.get(sys.platform, ())
    missing = [name for name in native if name not in plugins]
    if missing:
        raise SelfTestError(f"qt: the platform plugin(s) {', '.join(missing)} a desktop needs are missing")
    icon_path = resource(APP_ICON)
    if icon_path is None:
        raise SelfTestError(f"resources: {APP_ICON} not found")
    if QIcon(str(icon_path)).pixmap(64, 64).isNull():
        raise SelfTestError(f"qt: {icon_path} did not render (is the SVG plugin missing?)")
    _report("icon", f"{icon_path} renders")
    _report("first window", f"{first_window:.2f} s after start")
    window.close()  # frees its engine worker thread
    app.processEvents()
    return first_window


def _platform_plugins(plugins_dir: Path) -> list[str]:
    """Names like xcb, offscreen from files like libqxcb.so / qwindows.dll / libqcocoa.dylib."""
    stems = (path.name.split(".")[0] for path in (plugins_dir / "platforms").glob("*"))
    return sorted(stem.removeprefix("lib").removeprefix("q") for stem in stems)


def _wait(pump: Callable[[], None], done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SelfTestError(f"qt: {what} within {timeout:.0f} s")
        pump()
        time.sleep(0.005)


def _check_engine_session(model: Path, n_ctx: int, tmp: Path, origin: float) -> float:
    """Lazy cache: reply, force the conversion, reply, save and restore the snapshot, reply from it."""
    from lazykv.core.engine.engine import EngineSession
    from lazykv.core.engine.load_spec import LoadSpec
    from lazykv.core.errors import EngineError
    from lazykv.core.history.persistence import Crypto, Persistence
    from lazykv.core.history.records import new_uid
    from lazykv.core.history.snapshot import ENCRYPTION_NONE
    from lazykv.core.history.store import Database
    from lazykv.core.kinds import KvMode
    from lazykv.core.paths import FINGERPRINTS_FILE

    session = EngineSession()
    database = Database(tmp / "data" / "conversations.sqlite3", tmp / "data" / "snapshots")
    try:
        t0 = time.perf_counter()
        session.load(LoadSpec(model, n_ctx=n_ctx, kv_mode=KvMode.LAZY))
        _report("model load", f"{time.perf_counter() - t0:.2f} s (n_ctx {n_ctx}, lazy KV cache)")

        messages = [{"role": "user", "content": "Say hello in five words."}]
        reply, first, n_reused = _reply(session, messages)
        first_token = first - origin
        status = session.kv_status()
        if status.phase != "f16" or status.n_cells_used == 0:
            raise SelfTestError(f"lazy cache: expected f16 cells in use, got {status.phase}, "
                                f"{status.n_cells_used} cells")
        _report("first token", f"{first_token:.2f} s after start; reply {reply!r}")
        _report("lazy cache", f"f16 view, {status.n_cells_used} of {status.n_cells_capacity} cells in use")

        if not session.step_kv_now():
            raise SelfTestError("conversion: step_kv_now() had nothing to do")
        status = session.kv_status()
        if status.phase != "q8_0" or status.n_steps < 1:
            raise SelfTestError(f"conversion: the cache is {status.phase} after a forced conversion")
        messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "Again."}]
        reply, _, n_reused = _reply(session, messages)
        if n_reused == 0:
            raise SelfTestError("conversion: the reply after it did not reuse the converted cache")
        _report("conversion", f"forced to q8_0 in {status.last_step_s * 1000:.1f} ms; "
                f"next reply reused {n_reused} tokens: {reply!r}")

        messages = [*messages, {"role": "assistant", "content": reply}]
        conv = database.call(lambda s: s.sync_transcript(new_uid(), messages, 0, create=True)).id
        fingerprints = tmp / "data" / FINGERPRINTS_FILE
        persistence = Persistence(database, session, fingerprints, Crypto(ENCRYPTION_NONE))
        saved = persistence.save(conv, messages)
        session.clear_kv()
        opened = persistence.open(conv, messages, lambda done, total: None)
        if opened.how != "restored":
            raise SelfTestError(f"snapshot: not restored ({opened.how}: {opened.note})")
        reply, _, n_reused = _reply(session, [*messages, {"role": "user", "content": "Thanks."}])
        if n_reused == 0:
            raise SelfTestError("snapshot: the reply after restoring did not reuse the restored cache")
        _report("snapshot", f"saved {saved.n_tokens} tokens ({saved.size / 1024:.0f} KiB) in "
                f"{saved.seconds * 1000:.0f} ms, restored in {opened.seconds * 1000:.0f} ms "
                f"({session.kv_status().phase}); next reply reused {n_reused} tokens")
    except EngineError as err:
        raise SelfTestError(f"engine: {err}") from err
    finally:
        database.close()
        session.close()
    return first_token


def _reply(session: EngineSession, messages: Sequence[dict[str, str]]) -> tuple[str, float, int]:
    """(reply text, time.time() of its first piece, tokens reused from the cache) at temperature 0."""
    from lazykv.core.engine.types import SamplingSettings

    stream = session.stream_reply(
        messages, SamplingSettings(temperature=0.0), threading.Event(), max_tokens=MAX_TOKENS
    )
    first = 0.0
    while True:
        try:
            next(stream)
        except StopIteration as stop:
            result = stop.value
            break
        first = first or time.time()
    if not result.text:
        raise SelfTestError("engine: the model generated nothing")
    return result.text, first, result.n_reused
