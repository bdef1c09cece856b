"""GUI responsiveness benchmark: the longest event-loop gap while the engine generates and converts,
while a long code-heavy Markdown reply streams in, while the model's tool calls run on an MCP server that
floods or hangs, and while a 4,000-message conversation opens.

``python -m bench.gui_stall`` (part of ``make bench``) drives the real window offscreen with a 10 ms
timer running (lazykv.qt.stall_meter) and writes bench/results/gui_stall.md. The baseline is the
same timer with the engine idle, measured in the same run. ``--only open --runs N`` measures only
opening the long conversations (the 4,000-message one N times) and prints the table without
writing the report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from bench.machine import cpu_model

RESULTS = Path(__file__).resolve().parent / "results" / "gui_stall.md"
N_CTX = 2048  # lazy f16 view: 1024 cells
LONG_CONVERSATION = 4000  # messages
HUGE_CONVERSATION = 100_000  # messages, as a big import
TOKEN_INTERVAL_MS = 5  # the canned reply streams at 200 tokens/s, faster than this CPU's models
MCP_SERVER = Path(__file__).resolve().parents[1] / "tests" / "support" / "mcp_server.py"  # the SDK's, stdio
TOOL_TIMEOUT_S = 3
TOOL_OUTPUT_KIB = 2  # the flood's 5 MB cut to what the model's answer still fits with in N_CTX


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["LAZYKV_CONFIG_DIR"] = tempfile.mkdtemp(prefix="lazykv-bench-gui-")
    os.environ["LAZYKV_DATA_DIR"] = tempfile.mkdtemp(prefix="lazykv-bench-gui-data-")
    from PySide6.QtWidgets import QApplication
    from tools.screenshots import pause, wait_for

    from lazykv.__main__ import default_model_path, freeze_start_up_heap
    from lazykv.core.history.records import new_uid
    from lazykv.core.settings import Settings
    from lazykv.core.tools import mcp_config
    from lazykv.qt.main_window import MainWindow
    from lazykv.qt.stall_meter import StallMeter

    server = mcp_config.McpServerConfig(name="t", command=sys.executable, args=(str(MCP_SERVER),))
    mcp_config.save_servers([server])

    app = QApplication.instance() or QApplication(sys.argv[:1])
    settings = Settings()
    for name, value in {"n_ctx": N_CTX, "temperature": 0.0, "seed": 1, "max_reply_tokens": 64,
                        "idle_conversion": False, "snapshot_encryption": "none",
                        "tool_timeout_s": TOOL_TIMEOUT_S, "tool_output_kib": TOOL_OUTPUT_KIB}.items():
        settings.set(name, value)
    window = MainWindow(settings, default_model=default_model_path())
    freeze_start_up_heap()  # as the app does
    window.show()
    window.open_configured_model()
    wait_for(window.model_loaded)
    meter = StallMeter()
    rows: list[tuple[str, list[float], list[float], float]] = []
    conversions: list = []
    window.step_shown.connect(lambda e: conversions.append(e) if e.stage == "end" else None)

    def measure(label: str, action: Callable[[], None], until) -> None:  # noqa: ANN001 - a Qt signal
        meter.start()
        t0 = time.perf_counter()
        action()
        wait_for(until)
        meter.stop()
        rows.append((label, list(meter.gaps_ms), list(meter.cpu_gaps_ms), time.perf_counter() - t0))

    measure("engine idle (baseline, 2 s)", lambda: None, _timer_signal(app, 2000))
    if args.only != "open":
        _engine_and_stream_scenarios(window, measure)
        _tool_scenarios(window, measure)
    long_id = window.database.call(lambda store: store.sync_transcript(
        new_uid(), long_conversation(LONG_CONVERSATION), 0, title="A long conversation", create=True)).id
    for run in range(args.runs):
        if run:  # away from it (its re-read stopped), to open it again
            window.chat.new_chat()
            _wait_until(window.chat.can_switch_conversation, pause)
        measure(f"open a saved {LONG_CONVERSATION:,}-message conversation (read, shown, resume started; "
                "1.5 s)", lambda: window.conversations.open(long_id), _timer_signal(app, 1500))
    measure(f"scroll to the top of the {LONG_CONVERSATION:,}-message conversation, 20 times",
            lambda: _scroll_to_top(window.transcript, 20), _timer_signal(app, 1500))
    window.conversations.cancel_resume()
    _wait_until(window.chat.can_switch_conversation, pause)
    huge_id = window.database.call(lambda store: store.sync_transcript(
        new_uid(), long_conversation(HUGE_CONVERSATION), 0, title="A huge import", create=True)).id
    measure(f"open a saved {HUGE_CONVERSATION:,}-message conversation (read, shown, resume started; 3 s)",
            lambda: window.conversations.open(huge_id), _timer_signal(app, 3000))
    window.conversations.cancel_resume()
    _write(rows, conversions, args.only != "open")
    # as the app does at exit: stop the engine (the huge re-read) and wait with a deadline; a Python
    # exit with the engine's thread still in native code would abort ("QThread: Destroyed while ...")
    if not window.shutdown_engine():
        sys.stderr.flush()
        os._exit(0)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gui_stall", description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("all", "open"), default="all",
                        help="open: only the idle baseline and the long conversations (no report written)")
    parser.add_argument("--runs", type=int, default=1, metavar="N",
                        help="open the 4,000-message conversation N times (default 1)")
    return parser


def _engine_and_stream_scenarios(window, measure) -> None:  # noqa: ANN001 - MainWindow, a measuring function
    """Replies (f16, across the breakpoint), the idle conversion and a canned Markdown stream."""
    from tools.screenshots import wait_for

    measure("reply, 64 tokens, f16 phase", lambda: window.chat.send_text("Tell me about the sea."),
            window.reply_finished)
    items = ", ".join(f"item {i}" for i in range(200))  # ~1100 tokens: crosses the 1024-cell view
    measure("reply whose prompt crosses the breakpoint (conversion inside)",
            lambda: window.chat.send_text(f"Here is a list: {items}. Which item comes last?"),
            window.reply_finished)
    window.open_configured_model()  # a fresh cache
    wait_for(window.model_loaded)
    window.chat.new_chat()  # the story's prompt alone fills the f16 view; with the turns before, the context
    window.chat.send_text("Write a long story about a lighthouse keeper. " * 40)
    wait_for(window.reply_finished)
    measure("idle-time conversion (kv_lazy_convert)", window.chat.convert_now, window.converted)
    stream = _CannedStream(window.transcript, code_heavy_reply())
    measure(f"code-heavy Markdown reply streamed ({len(stream.pieces)} pieces, {len(stream.text) // 1024} KB,"
            f" {stream.text.count('```') // 2} code blocks, a piece every {TOKEN_INTERVAL_MS} ms)",
            stream.start, stream.done)


def _tool_scenarios(window, measure) -> None:  # noqa: ANN001 - MainWindow, a measuring function
    """The model made to call a tool (as the API's named tool_choice): the consent dialog answered "Allow
    once" as soon as it shows, the call run on the MCP server, its result shown, the model's answer."""
    from PySide6.QtCore import QTimer
    from tools.screenshots import pause

    from lazykv.core.tools.mcp_hub import ServerState
    from lazykv.qt.tool_consent import ToolConsentDialog

    hub = window.tool_calls.hub
    _wait_until(lambda: hub.status()["t"].state is ServerState.READY, pause, 60)

    def allow() -> None:
        asked = [d for d in window.findChildren(ToolConsentDialog) if d.isVisible()]
        if asked:
            asked[-1].allow_once.click()
        else:
            QTimer.singleShot(20, allow)

    flood = f"a tool call whose 5 MB output is cut at the cap ({TOOL_OUTPUT_KIB} KiB), then the answer"
    for tool, label in (("t__flood", flood),
                        ("t__hang", f"a tool call that hangs until its timeout ({TOOL_TIMEOUT_S} s), then "
                                    "the answer")):
        window.chat.new_chat()
        window.tool_calls.force_next(tool)
        QTimer.singleShot(20, allow)
        measure(label, lambda: window.chat.send_text("Use the tool, please."), window.reply_finished)


def code_heavy_reply() -> str:
    """About 6 KB of Markdown: prose, lists, tables and 24 fenced code blocks (Python and shell)."""
    block = (
        "Here is the next step, with **the important part** in bold and a `short_call()` inline.\n\n"
        "1. read the file\n2. parse each line\n3. keep the valid rows\n\n"
        "```python\nimport csv\nfrom pathlib import Path\n\n\ndef load(path: Path) -> list[dict[str, str]]:\n"
        "    with path.open(newline=\"\") as f:\n        rows = list(csv.DictReader(f))\n"
        "    return [row for row in rows if row.get(\"id\")]\n```\n\n"
        "| column | type | note |\n|---|---|---|\n| id | int | unique |\n| name | str | trimmed |\n\n"
        "```bash\nfor f in data/*.csv; do\n    python load.py \"$f\" >> out.txt\ndone\n```\n\n"
    )
    return "".join(block.replace("next step", f"step {i + 1}") for i in range(12))


def long_conversation(n: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Question {i}: how do I reverse a list in place?"} if i % 2 == 0 else
        {"role": "assistant", "content": f"Answer {i}: use **list.reverse()**.\n\n```python\nitems = [1, 2]\n"
                                         "items.reverse()\n```\nIt returns `None`."}
        for i in range(n)
    ]


def _wait_until(ready: Callable[[], bool], pause: Callable[[int], None], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get ready in time")
        pause(50)


def _scroll_to_top(view, times: int) -> None:  # noqa: ANN001 - a TranscriptView
    for k in range(times):
        QTimer.singleShot(50 * k, lambda: view.verticalScrollBar().setValue(0))


class _CannedStream(QObject):
    """Feeds a reply to the transcript piece by piece on a timer, as the worker's tokens arrive."""

    done = Signal()

    def __init__(self, view, text: str) -> None:  # noqa: ANN001 - a TranscriptView
        super().__init__()
        self.view, self.text = view, text
        self.pieces = [text[i:i + 4] for i in range(0, len(text), 4)]  # ~ a token each
        self._timer = QTimer(self)
        self._timer.setInterval(TOKEN_INTERVAL_MS)
        self._timer.timeout.connect(self._next)
        self._next_piece = 0

    def start(self) -> None:
        self.view.begin_reply()
        self._timer.start()

    def _next(self) -> None:
        if self._next_piece < len(self.pieces):
            self.view.append_to_reply(self.pieces[self._next_piece])
            self._next_piece += 1
            return
        self._timer.stop()
        self.view.end_reply()
        self.done.emit()


def _timer_signal(app, ms: int):  # noqa: ANN001, ANN202 - Qt objects
    timer = QTimer(app)
    timer.setSingleShot(True)
    timer.start(ms)
    return timer.timeout


def _write(rows: list[tuple[str, list[float], list[float], float]], conversions: list,  # noqa: ANN001
           report: bool = True) -> None:
    base = max(rows[0][1])
    lines = [
        "# GUI responsiveness: longest event-loop gap",
        "",
        f"`python -m bench.gui_stall` on {cpu_model()}, "
        f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end of the run), SmolLM2-135M "
        f"Q4_1, lazy KV cache, n_ctx {N_CTX}, 10 ms timer on the GUI thread (offscreen). A gap is the "
        "time between two timer ticks; a GUI thread that waited on the engine would show a gap as long "
        "as a decode step or the conversion. *GUI CPU* is the longest "
        "time the GUI thread itself computed between two ticks (its thread CPU time): a wall-clock gap "
        "much longer than it was spent waiting for a core or the GIL, not working.",
        "",
        "| scenario | wall s | ticks | median gap ms | p99 gap ms | max gap ms | max / idle max "
        "| max GUI CPU ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, gaps, cpu_gaps, wall in rows:
        p99 = sorted(gaps)[max(0, int(0.99 * len(gaps)) - 1)]
        lines.append(
            f"| {label} | {wall:.1f} | {len(gaps)} | {statistics.median(gaps):.1f} | {p99:.1f} | "
            f"{max(gaps):.1f} | {max(gaps) / base:.2f} | {max(cpu_gaps):.1f} |"
        )
    if conversions:
        lines += ["", "Conversions in this run: " + ", ".join(
            f"{1000 * e.duration_s:.0f} ms at token {e.n_cells}" for e in conversions) + "."]
    if report:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
