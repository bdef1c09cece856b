"""llama.cpp's own state suite, built from our tree, on every architecture it knows.

``test-llama-archs -o DIR`` writes a small random model of each architecture (once per build of
the programs, kept beside them: the models name the test cases, so they must exist at collection);
``test-save-load-state`` runs its nine state tests on each.
Each cell (cache config × model × test) is one pytest case: pass, fail, or skip with the reason.

Each config runs on first use, one child process per model (``make native-tools`` builds the
programs): a crash fails the test it happened in, the tests after it fail as not run, and
pytest goes on. The only skip: test 9 ("rf") turns flash attention off, which a quantized V
cache cannot run, so where the program reports exactly that, the cell is skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import pytest

from tests.support.native_scripts import load_native_script
from tests.support.summary import write_summary
from tests.support.synthetic_gguf import write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]
TESTS = ("baseline", "seq_rm", "state_load", "cp_h", "cp_d", "cp_h_s", "cp_d_s", "rt", "rf")
TITLES = {  # "=== Test N: <title> ===" in the program's verbose output
    "baseline": "baseline", "seq_rm": "sequence removal isolation", "state_load": "state load",
    "cp_h": "seq copy (host)", "cp_d": "seq copy (device)", "cp_h_s": "seq copy (host, scatter)",
    "cp_d_s": "seq copy (device, scatter)", "rt": "state blob round-trip", "rf": "state restore failure",
}
GENERATE_TIMEOUT_S = 600
MODEL_TIMEOUT_S = 120
Q8 = ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")
LAZY = {"LLAMA_KV_CACHE_LAZY_QUANT": "1"}
# "rf" (test 9) turns flash attention off to expose NaNs; a quantized V cache cannot run without it
RF_NEEDS_FA_OFF = ("rf: test 9 turns flash attention off, which a quantized V cache cannot run "
                   "(context creation refused)")
STATUSES = {"PASS", "FAIL", "SKIP"}  # the program's own, per test
_CONFIG_REFUSED = re.compile(  # llama_init_from_model's refusals of a cache type for a model
    r"llama_init_from_model: ((?:flash_attn is not compatible with .*? - forcing off"
    r"|quantized V cache requires flash_attn to be enabled"
    r"|[KV] cache type \S+ with block size \d+ does not divide n_embd_head_[kv]=\d+))")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Config:
    name: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    quantized_v: bool = False


CONFIGS = (
    Config("f16", ("-ctk", "f16", "-ctv", "f16")),
    Config("q8_0", Q8, quantized_v=True),
    Config("lazy", Q8, LAZY, quantized_v=True),
    # tests 1, 3-5 and 8 use -c; the others a 256-cell context. 136 f16 cells for 200 prompt tokens:
    # the lazy cache converts to q8_0 while the tests decode, save and restore
    Config("lazy-converting", (*Q8, "-c", "256", "-b", "200"), LAZY, quantized_v=True),
    # the ladder (72 f16 cells of 256) climbs to q4_0 on the first prompt, its last 32 tokens in the recent
    # f16 window (patches 0019, 0024): the tests decode, copy, save and restore with the window in use
    Config("ladder-recent", ("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on", "-c", "256", "-b", "200",
                             "--kv-recent", "32"), LAZY, quantized_v=True),
)


@dataclass(frozen=True)
class Cell:
    status: str  # pass | fail | skip
    reason: str = ""


Table = dict[str, dict[str, Cell]]  # model -> test -> cell


def _build_module():  # noqa: ANN202 - the module object of native/build.py
    return load_native_script("build.py", "lazykv_native_build")


def tools_dir() -> Path:
    """The built test programs of the current patch series; a clear error when not built."""
    build = _build_module()
    path = build.tools_dir()
    missing = [name for name in ("test-llama-archs", "test-save-load-state") if not (path / name).is_file()]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not built for this patch series (expected in {path}): "
                           "run `make native-tools`")
    return path


def _child_env(config: Config | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLAMA_ARG_", "LLAMA_KV_", "LLAMA_ATTN_"))}
    env.update(config.env if config else {})
    return env


def arch_models(tools: Path) -> tuple[Path, list[str]]:
    """A random model of every architecture, written once per build of the programs (beside them)."""
    out = tools / "arch-models"
    if not out.is_dir():
        staging = Path(tempfile.mkdtemp(dir=tools, prefix="arch-models-"))
        proc = subprocess.run([str(tools / "test-llama-archs"), "-o", str(staging)], capture_output=True,
                              text=True, timeout=GENERATE_TIMEOUT_S, env=_child_env())
        if proc.returncode != 0 or not any(staging.glob("*.gguf")):
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"test-llama-archs -o failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        try:
            staging.rename(out)
        except OSError:  # another session wrote them first
            shutil.rmtree(staging, ignore_errors=True)
    return out, sorted(p.name for p in out.glob("*.gguf"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" not in metafunc.fixturenames:
        return
    config = metafunc.config
    if not hasattr(config, "_lazykv_arch_models"):
        tools = tools_dir()
        config._lazykv_arch_models = (tools, *arch_models(tools))  # type: ignore[attr-defined]
    _, _, models = config._lazykv_arch_models  # type: ignore[attr-defined]
    cells = [(c.name, m, t) for c in CONFIGS for m in models for t in TESTS]
    metafunc.parametrize("cell", cells, ids=[f"{c}-{m.removesuffix('.gguf')}-{t}" for c, m, t in cells])


# ---------------------------------------------------------------- running and parsing


def _run(tools: Path, config: Config, args: list[str], cwd: Path, timeout: int) -> tuple[int, str]:
    cmd = [str(tools / "test-save-load-state"), "-t", "1", *config.args, *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=timeout, env=_child_env(config))
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        return -int(signal.SIGKILL), _ANSI.sub("", out) + f"\n[timed out after {timeout} s]"
    return proc.returncode, _ANSI.sub("", proc.stdout)


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()
             if "GGML_ASSERT" in ln or "error" in ln.lower() or "failed" in ln.lower()]
    return lines[-1][:300] if lines else ""


def _failure_reason(test: str, text: str) -> str:
    """What the program logged about ``test``: its own section's errors, else lines naming its function."""
    sections = re.split(r"^=== Test \d+: (.*) ===$", text, flags=re.M)
    own = next((body for title, body in zip(sections[1::2], sections[2::2], strict=True)
                if title == TITLES[test]), None)
    if own is None:
        own = "\n".join(ln for ln in text.splitlines() if f"{_function(test)}:" in ln)
    return _last_error(own) or "failed (no message)"


def _function(test: str) -> str:
    return {"baseline": "test_baseline", "seq_rm": "test_seq_rm_isolated", "state_load": "test_state_load",
            "cp_h": "test_seq_cp_host", "cp_d": "test_seq_cp_device", "cp_h_s": "test_seq_cp_scatter",
            "cp_d_s": "test_seq_cp_scatter", "rt": "test_state_roundtrip",
            "rf": "test_state_restore_failure"}[test]


def verbose_cells(config: Config, rc: int, text: str) -> dict[str, Cell]:
    """One model's cells from its run's verbose output ("=== Test N: <title> ===", then "PASS")."""
    passed = _headers_and_passes(text)
    if "state_load" in passed:
        passed["baseline"] = True  # tests 3-5 run only after a good baseline (which prints no PASS)
    crashed_in = _crashed_in(passed) if rc not in (0, 1) else None
    died = f"{_exit_text(rc)}: {_last_error(text)}"
    cells = {}
    for i, test in enumerate(TESTS):
        if passed.get(test):
            cells[test] = Cell("pass")
        elif crashed_in is None or i < TESTS.index(crashed_in):
            cells[test] = Cell("fail", _failure_reason(test, text))
        elif test == crashed_in:
            cells[test] = Cell("fail", f"crashed ({died})")
        else:
            cells[test] = Cell("fail", f"not run: the program crashed in {crashed_in} ({died})")
    return cells


def _headers_and_passes(text: str) -> dict[str, bool]:
    """Tests whose header was printed, in order, each with whether PASS followed it."""
    titles = {title: test for test, title in TITLES.items()}
    passed: dict[str, bool] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"=== Test \d+: (.*) ===", line.strip())
        if m and m.group(1) in titles:
            current = titles[m.group(1)]
            passed[current] = False
        elif current and line.strip().startswith("PASS"):
            passed[current] = True
    return passed


def _crashed_in(passed: dict[str, bool]) -> str:
    """The test a run died in: the last one started, unless it passed (then the next one)."""
    started = list(passed)
    if not started:
        return TESTS[0]
    last = started[-1]
    if not passed[last]:
        return last
    later = TESTS[TESTS.index(last) + 1:]
    return later[0] if later else last


def run_config(tools: Path, models_dir: Path, models: list[str], config: Config) -> Table:
    """Every model's cells for one config, one model per child process, one process per core at a time."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        cells = pool.map(lambda model: run_model(tools, models_dir, model, config), models)
        return dict(zip(models, cells, strict=True))


def run_model(tools: Path, models_dir: Path, model: str, config: Config) -> dict[str, Cell]:
    """One model's nine cells.

    First the program's table for this model alone (its statuses are flushed, but it prints no
    reasons); where a test failed or the program died, again alone and verbosely for the reasons
    and the test it died in. The program's log is written by a thread it does not wait for, so the
    verbose run's last lines can be missing: the table's statuses are the verdict.
    """
    with tempfile.TemporaryDirectory(prefix=f"lazykv-state-{config.name}-") as tmp:
        work = Path(tmp)
        (work / "model").mkdir()
        (work / "model" / model).symlink_to(models_dir / model)
        rc, text = _run(tools, config, ["--models", str(work / "model")], work, MODEL_TIMEOUT_S)
        statuses = row_statuses(text, model)
        if statuses is not None and not any(_failed(config, t, s) for t, s in statuses.items()):
            return _table_cells(config, statuses, "")
        rc_verbose, verbose = _run(tools, config, ["-m", str(models_dir / model)], work, MODEL_TIMEOUT_S)
    refused = probe_refusal(models_dir / model, config) if config.quantized_v else ""
    if refused:
        return {t: Cell("skip", f"the engine cannot run this model with a {config.name} cache: {refused}")
                for t in TESTS}
    if statuses is not None:
        return _table_cells(config, statuses, verbose)
    if rc_verbose in (0, 1):  # died in the table run only
        return {t: Cell("fail", f"the program died ({_exit_text(rc)}: {_last_error(text)}); "
                           "run again alone it did not") for t in TESTS}
    return verbose_cells(config, rc_verbose, verbose)


# a q8_0 context on the model, as the program's configs ask for one, in a child of its own
PROBE = """
import sys, llama_cpp
try:
    llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, flash_attn=True, verbose=True,
                    type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0).close()
except ValueError:
    sys.exit(3)
"""


def probe_refusal(model: Path, config: Config) -> str:
    """Why the engine refuses a context of this config's cache types on ``model`` ("" if it does not).

    Asked of the engine directly (its log is synchronous there): the program's own log of the same
    refusal can be lost when it then crashes on the missing context.
    """
    proc = subprocess.run([sys.executable, "-c", PROBE, str(model)], capture_output=True, text=True,
                          timeout=MODEL_TIMEOUT_S, env=_child_env(config))
    return config_refused(proc.stderr) if proc.returncode == 3 else ""


def config_refused(log: str) -> str:
    """The engine's reasons for refusing a cache config on a model, from its log: a K head size that
    is not a multiple of the q8_0 block, or flash attention forced off under a quantized V cache."""
    return "; ".join(dict.fromkeys(m.group(1) for m in _CONFIG_REFUSED.finditer(log)))


def _table_cells(config: Config, statuses: dict[str, str], verbose: str) -> dict[str, Cell]:
    cells = {}
    for test, status in statuses.items():
        if status == "PASS":
            cells[test] = Cell("pass")
        elif _rf_skip(config, test, status):
            cells[test] = Cell("skip", RF_NEEDS_FA_OFF)
        else:
            cells[test] = Cell("fail", f"{status}: {_failure_reason(test, verbose)}")
    return cells


def _failed(config: Config, test: str, status: str) -> bool:
    return status != "PASS" and not _rf_skip(config, test, status)


def row_statuses(text: str, model: str) -> dict[str, str] | None:
    """The program's PASS/FAIL/SKIP per test from its --models table; None if the row never finished."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] == [model] and len(words) == 1 + len(TESTS) and set(words[1:]) <= STATUSES:
            return dict(zip(TESTS, words[1:], strict=True))
    return None


def _rf_skip(config: Config, test: str, status: str) -> bool:
    """Test 9 failing under a quantized V cache: it cannot create its flash-attention-off context
    (test_a_quantized_v_cache_needs_flash_attention checks that the engine refuses exactly that)."""
    return test == "rf" and status == "FAIL" and config.quantized_v


# ---------------------------------------------------------------- the cases


@pytest.fixture(scope="module")
def suite(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Table]]:
    """``suite(config name)``: its table, run on first use; a tally per config run at the end."""
    tools, models_dir, models = request.config._lazykv_arch_models  # type: ignore[attr-defined]
    results: dict[str, Table] = {}
    selected = [item.callspec.params["cell"] for item in request.session.items if hasattr(item, "callspec")
                and "cell" in item.callspec.params]

    def table(name: str) -> Table:
        """Run only the models some selected case needs (all of them in `make test`)."""
        if name not in results:
            config = next(c for c in CONFIGS if c.name == name)
            wanted = sorted({m for c, m, _ in selected if c == name} & set(models))
            results[name] = run_config(tools, models_dir, wanted, config)
        return results[name]

    yield table
    for name, table in results.items():
        tally = Counter(cell.status for row in table.values() for cell in row.values())
        failing = Counter(t for row in table.values() for t, cell in row.items() if cell.status == "fail")
        line = (f"llama.cpp state suite [{name}]: {len(table)} models × {len(TESTS)} tests: "
                f"{tally['pass']} pass, {tally['fail']} fail, {tally['skip']} skip"
                + (f"; failing by test: {dict(failing)}" if failing else ""))
        write_summary(request.config, line)


@pytest.mark.slow
def test_state_suite_cell(cell: tuple[str, str, str], suite: Callable[[str], Table]) -> None:
    config, model, test = cell
    result = suite(config)[model][test]
    if result.status == "skip":
        pytest.skip(result.reason)
    assert result.status == "pass", f"{config} × {model} × {test}: {result.reason}"


# ---------------------------------------------------------------- the harness's own parsing


def test_table_row_statuses() -> None:
    text = ("Model            baseline  seq_rm  state_load  cp_h  cp_d  cp_h_s  cp_d_s  rt    rf\n"
            "llama-dense.gguf  PASS  PASS  PASS  PASS  FAIL  PASS  PASS  PASS  FAIL\n")
    statuses = row_statuses(text, "llama-dense.gguf")
    assert statuses is not None and statuses["cp_d"] == statuses["rf"] == "FAIL" and statuses["rt"] == "PASS"
    assert row_statuses("Model  baseline\nllama-dense.gguf", "llama-dense.gguf") is None  # died in the row
    assert _rf_skip(CONFIGS[1], "rf", "FAIL") and not _rf_skip(CONFIGS[0], "rf", "FAIL")
    assert not _rf_skip(CONFIGS[1], "rt", "FAIL")


def test_a_cache_the_engine_refuses_for_the_model_is_named() -> None:
    grok = ("0.00.007 E llama_init_from_model: quantized V cache requires flash_attn to be enabled\n"
            "0.00.012 W llama_init_from_model: flash_attn is not compatible with Grok - forcing off\n"
            "0.00.012 E llama_init_from_model: quantized V cache requires flash_attn to be enabled\n")
    assert config_refused(grok) == ("quantized V cache requires flash_attn to be enabled; "
                                    "flash_attn is not compatible with Grok - forcing off")
    refusal = "K cache type q8_0 with block size 32 does not divide n_embd_head_k=80"
    laguna = f"E llama_init_from_model: {refusal}\n"
    assert config_refused(laguna) == refusal
    assert config_refused("llama_init_from_model: n_ctx = 256\n") == ""


def test_a_quantized_v_cache_needs_flash_attention(tmp_path: Path) -> None:
    """Why "rf" is skipped for q8_0 and lazy: a quantized V cache cannot run without flash attention."""
    model = write_llama_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(ValueError):
        llama_cpp.Llama(model_path=str(model), n_ctx=256, verbose=False, flash_attn=False,
                        type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0)
    llama_cpp.Llama(model_path=str(model), n_ctx=256, verbose=False, flash_attn=False).close()


def test_a_crash_fails_its_test_and_the_rest_are_not_run() -> None:
    text = ("=== Test 1: baseline ===\n1 2 3\n=== Test 2: sequence removal isolation ===\nPASS\n"
            "=== Test 3: state load ===\n\nPASS\n=== Test 4: seq copy (host) ===\n\nPASS\n"
            "=== Test 5: seq copy (device) ===\ngenerate_tokens_compare: error: NMSE at step 1 is 3e-02\n"
            "=== Test 6: seq copy (host, scatter) ===\nPASS\n"
            "llama-io.cpp:12: GGML_ASSERT(type >= 0 && type < GGML_TYPE_COUNT) failed\n")
    cells = verbose_cells(CONFIGS[1], -int(signal.SIGABRT), text)
    assert [cells[t].status for t in TESTS] == ["pass"] * 4 + ["fail", "pass"] + ["fail"] * 3
    assert "NMSE" in cells["cp_d"].reason
    assert "crashed (killed by SIGABRT: llama-io.cpp:12: GGML_ASSERT" in cells["cp_d_s"].reason
    assert cells["rf"].reason.startswith("not run: the program crashed in cp_d_s")
