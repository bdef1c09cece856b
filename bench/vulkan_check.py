"""``make vulkan-check``: the lazy cache on Vulkan, a second real GPU API, on Mesa's lavapipe where no GPU is.

1. The Vulkan engine: ``LAZYKV_BACKEND=vulkan native/build.py wheel`` (cached by its inputs like the CPU
   one, built in native/work/build-vulkan), unpacked into native/work/vulkan-engine. The CPU engine in
   .venv is not touched: the checks run in child processes with the Vulkan engine first on sys.path and
   ``GGML_VK_VISIBLE_DEVICES=0`` (ggml-vulkan leaves a CPU device such as lavapipe out unless it is named).
2. ``native/gpu_check/lazy_check.cpp`` (what ``make gpu-check`` runs on a GPU) on the Vulkan device: the
   f16 phase bit-exact, KLD after the breakpoint, a conversion behind unread decodes, the pause against a
   device copy, the graph computes per conversion, decode speed.
3. The ladder and a refused restore on the device (``--device-checks``, SmolLM2, every layer on Vulkan):
   both steps of the ladder against the same ladder in host memory (codes off by at most one, rarely),
   a state of the q8_0 rung refused by a plain f16 cache with its reason, and the cache still usable; a
   recent window on the device (its bytes, its f16 rung bit-identical to the ladder without one, its
   q4_0 rung closer to the host's window than to no window).
4. ggml-vulkan's CONVERT_ROWS kernel (the conversion the lazy cache runs there) and its flash attention over a
   second F16 K/V range (the recent window) against the CPU's: llama.cpp's test-backend-ops built for Vulkan
   from the series (native/work/build-vktools).
5. The memory plan against what the engine allocated on the device (``bench.plan_accuracy`` with the
   ``gpu-half`` and ``gpu-all`` placements).

Writes bench/results/vulkan_check.md; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "vulkan_check.md"
ENGINE_DIR = ROOT / "native" / "work" / "vulkan-engine"
# lazy_check's context on lavapipe (every layer's compute on the CPU, through Vulkan), with each timing once
# and decode speed over 8 tokens: its Llama-3-8B-shaped model takes long there
N_CTX_CHECK = 1024


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, check=True, **kwargs)


def vulkan_engine() -> tuple[Path, str, float]:
    """The Vulkan wheel (cached or built) unpacked into ENGINE_DIR: (that dir, the wheel's name, seconds)."""
    t0 = time.monotonic()
    env = dict(os.environ, LAZYKV_BACKEND="vulkan")
    wheel = Path(run([sys.executable, str(ROOT / "native" / "build.py"), "wheel"], env=env,
                     capture_output=True, text=True).stdout.strip().splitlines()[-1])
    stamp = ENGINE_DIR / ".wheel"
    if not (stamp.is_file() and stamp.read_text() == wheel.name):
        shutil.rmtree(ENGINE_DIR, ignore_errors=True)
        ENGINE_DIR.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(ENGINE_DIR)
        for lib in (ENGINE_DIR / "llama_cpp" / "lib").iterdir():  # zip does not keep the mode bits
            lib.chmod(0o755)
        stamp.write_text(wheel.name)
    return ENGINE_DIR, wheel.name, time.monotonic() - t0


def child_env(engine: Path) -> dict[str, str]:
    paths = [str(engine), str(ROOT), str(ROOT / "app")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]),
                GGML_VK_VISIBLE_DEVICES="0", QT_QPA_PLATFORM="offscreen")


def lazy_check(engine: Path) -> tuple[str, bool]:
    """lazy_check.cpp against the Vulkan engine's libraries, on the Vulkan device."""
    sys.path.insert(0, str(engine))
    from bench.device import compile_check  # imports llama_cpp: the Vulkan one, first on sys.path

    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_check(Path(tmp))
        proc = subprocess.run([str(exe), str(Path(tmp) / "model.gguf"), str(N_CTX_CHECK)],
                              capture_output=True, text=True, timeout=3600,
                              env=dict(child_env(engine), LAZY_CHECK_REPS="1", LAZY_CHECK_DECODE_TOKENS="8"))
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"lazy_check failed ({proc.returncode}): {proc.stderr[-3000:]}")
    body = proc.stdout.replace("# Lazy KV cache on", "## lazy_check on", 1)
    return body, proc.returncode == 0


# ---------------------------------------------------------------- the ladder and a refused restore (child)


def backend_ops() -> tuple[str, bool]:
    """llama.cpp's test-backend-ops built for Vulkan from the exported series (native/work/build-vktools):
    ggml-vulkan's CONVERT_ROWS (0027) and its flash attention over a second F16 K/V range (the recent window,
    0019) against the CPU's."""
    sys.path.insert(0, str(ROOT / "native"))
    import build as native_build

    src = native_build.tools_source() / "vendor" / "llama.cpp"
    build_dir = native_build.WORK / "build-vktools"
    run(["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja", *native_build.tools_cmake_args(),
         "-DGGML_VULKAN=ON"], capture_output=True)
    run(["cmake", "--build", str(build_dir), "--target", "test-backend-ops"])
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"}
    body, ok = [], True
    for title, op, extra in (("The conversion (CONVERT_ROWS) against the CPU", "CONVERT_ROWS", []),
                             ("Flash attention over a second K/V range (the recent window) against the CPU",
                              "FLASH_ATTN_EXT", ["-p", "kv2="])):
        args = ["test", "-b", "Vulkan0", "-o", op, *extra]
        died = ""
        for attempt in (1, 2):
            proc = subprocess.run([str(build_dir / "bin" / "test-backend-ops"), *args],
                                  capture_output=True, text=True, env=env, timeout=1800)
            cases = [line.strip() for line in proc.stdout.splitlines()
                     if line.strip().startswith(f"{op}(") and "not supported" not in line]
            if proc.returncode == 0:
                break
            how = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                   else f"exit status {proc.returncode}")
            last = proc.stderr.strip().splitlines()[-1:] or ["nothing on stderr"]
            died += f" Run {attempt} ended after {len(cases)} cases, {how}: `{last[0]}`."
            # Mesa 22.3's lavapipe aborts the kv2 set now and then in its own queue thread
            # (results/lavapipe_kv2_abort.md): a signal after no failed case is run once more, and said
            if proc.returncode > 0 or any("FAIL" in case for case in cases):
                break
            died += " Its known lavapipe 22.3 fault: bench/results/lavapipe_kv2_abort.md."
        passed = re.search(r"(\d+)/(\d+) tests passed", proc.stdout)
        all_passed = passed is not None and passed[1] == passed[2] and int(passed[2]) > 0
        ok = ok and proc.returncode == 0 and all_passed
        body.append(f"## {title}\n\n`test-backend-ops {' '.join(args)}`, built for Vulkan from the series: "
                    f"{passed[0] if passed else 'no summary'}.{died}\n\n```\n" + "\n".join(cases) + "\n```\n")
    return "\n".join(body), ok


def next_tokens(ref, other) -> tuple[int, float]:
    """Rows of logits: how many pick ref's most likely token, and the mean KL(softmax(ref) ||
    softmax(other)) (bench.quality.compare_rows)."""
    from bench.quality import compare_rows

    kld, top1 = compare_rows(ref, other, block=len(ref))
    return int(top1.sum()), float(kld.mean())


def device_checks() -> int:
    """Run in the child: prints Markdown rows; exit status 1 when a check fails."""
    import llama_cpp
    import numpy as np
    from tests.native.helpers import make_llama
    from tests.native.state_blob import byte_mismatches, conversion_mismatches, parse_context_state

    from lazykv.core.engine.devices import local_gpus
    from lazykv.core.models import model_fetch

    gpus = local_gpus()
    if not gpus or not gpus[0].name.startswith("Vulkan"):
        print(f"no Vulkan device: {[g.name for g in gpus]}", file=sys.stderr)
        return 2
    path = model_fetch.models_dir() / model_fetch.MODELS["smollm2"].filename
    ok = True
    rows = [f"| device | {gpus[0].name} ({gpus[0].description}) |"]
    limit = gpus[0].max_tensor
    shown = f"{limit / 2**20:.1f} MiB" if limit else "no limit below 1 TiB"
    rows.append("| the largest tensor an op may have on it (supports_op, what the plan keeps a too large "
                f"output matrix in host memory by) | {shown} |")

    n_ctx = 1024  # rungs 256 / 512 / 1024
    device = make_llama(path, "ladder", n_ctx=n_ctx, n_gpu_layers=-1, logits_all=True)
    uses = device.memory_breakdown()
    on_device = sum(u.kv for u in uses if not u.host)
    kv_bytes = device.kv_lazy_info().kv_bytes
    rows.append(f"| the ladder's KV cache on the device | {on_device} of {kv_bytes} bytes |")
    ok &= on_device == kv_bytes
    tokens = device.tokenize(("The quick brown fox jumps over the lazy dog. " * 40).encode())[:200]
    device.eval(tokens)
    states = [device.save_state()]
    for rung in ("q8_0", "q4_0"):
        assert device.kv_lazy_convert()
        states.append(device.save_state())
        info = device.kv_lazy_info()
        good = info.phase == rung
        ok &= good
        pause_ms = info.last_conversion_s * 1000
        rows.append(f"| ladder step to {rung} on the device | the engine's pause {pause_ms:.1f} ms, "
                    f"{info.progress_done} of {info.progress_total} tensors ({'ok' if good else 'FAIL'}) |")
    f16, q8, q4 = (parse_context_state(st.llama_state)[1][0] for st in states)
    # f16 -> q8_0: the device's own f16 cells, rotated and quantized by the NumPy oracle
    off, total = conversion_mismatches(f16, q8)
    good = off / total < 1e-3
    ok &= good
    rows.append(f"| f16 -> q8_0 on the device against the NumPy oracle: q8_0 codes one step off | {off} of "
                f"{total} ({'ok' if good else 'FAIL'}) |")
    # q8_0 -> q4_0: the device's q8_0 cells converted by the host's ladder (the CPU's reference-exact kernel)
    host = make_llama(path, "ladder", n_ctx=n_ctx, logits_all=True)
    host.load_state(states[1])
    assert host.kv_lazy_convert()
    ref = parse_context_state(host.save_state().llama_state)[1][0]
    off, total = byte_mismatches(q4, ref, llama_cpp.GGML_TYPE_Q4_0)
    good = off / total < 1e-2
    ok &= good
    rows.append(f"| q8_0 -> q4_0 on the device against the host's conversion of the same q8_0 cells: bytes "
                f"that differ | {off} of {total} ({'ok' if good else 'FAIL'}) |")
    # the device goes on decoding from its last rung; the host, from the device's q4_0 state, agrees
    host.load_state(states[2])
    logits = {}
    for name, llm in (("device", device), ("host", host)):
        llm.eval(tokens[:8])
        logits[name] = np.array(llm.scores[llm.n_tokens - 8 : llm.n_tokens])
    agree, mean_kld = next_tokens(logits["host"], logits["device"])
    good = agree >= 7 and mean_kld < 0.01 and bool(np.all(np.isfinite(logits["device"])))
    ok &= good
    rows.append(f"| 8 more tokens after the last step, device against host (from the device's state): the "
                f"same most likely token, mean KLD | {agree} of 8, {mean_kld:.5f} "
                f"({'ok' if good else 'FAIL'}) |")

    # a state of the q8_0 rung, saved on the device: a plain f16 cache refuses it with a reason, and
    # is emptied (the binding's contract) and usable
    lazy = make_llama(path, "lazy", n_ctx=512, n_gpu_layers=-1)
    lazy.eval(tokens)
    lazy.eval(tokens[:120])  # past the f16 view's 256 cells: converted inside this decode, on the device
    state = lazy.save_state()
    rows.append(f"| a lazy cache on the device crosses its breakpoint inside a decode | phase "
                f"{lazy.kv_lazy_info().phase} |")
    ok &= lazy.kv_lazy_info().phase == "q8_0"
    plain = make_llama(path, "f16", n_ctx=512, n_gpu_layers=-1)
    plain.eval(tokens[:16])
    try:
        plain.load_state(state)
        refused, reason = False, "restored"
    except llama_cpp.StateMismatchError as err:
        refused, reason = True, str(err).splitlines()[0]
    verdict = "refused" if refused else "NOT refused"
    rows.append(f"| a q8_0-rung state into a plain f16 cache on the device | {verdict}: {reason} |")
    emptied = plain.n_tokens == 0  # the binding's contract: after a refusal the destination holds nothing
    plain.eval(tokens[:4])
    still = emptied and plain.n_tokens == 4
    rows.append(f"| the refused cache: emptied, and it decodes again | {'yes' if still else 'NO'} |")
    ok &= refused and still

    # the recent window on the device: one flash attention over the quantized rung and the window's f16 rows
    # (ggml-vulkan: a dispatch per range into the split_k slots, merged by the split_k reduce)
    # (logits_all: without it the binding keeps no logits in `scores`)
    windowed = make_llama(path, "ladder", n_ctx=n_ctx, n_gpu_layers=-1, kv_lazy_recent=128,
                          logits_all=True)
    no_window = make_llama(path, "ladder", n_ctx=n_ctx, n_gpu_layers=-1, logits_all=True)
    host_window = make_llama(path, "ladder", n_ctx=n_ctx, kv_lazy_recent=128, logits_all=True)
    host_no_window = make_llama(path, "ladder", n_ctx=n_ctx)
    extra = windowed.kv_lazy_info().kv_bytes - no_window.kv_lazy_info().kv_bytes
    host_extra = host_window.kv_lazy_info().kv_bytes - host_no_window.kv_lazy_info().kv_bytes
    good = extra > 0 and extra == host_extra
    ok &= good
    rows.append(f"| a ladder with a recent window of 128 on the device: the window's bytes (the host's) | "
                f"{extra} ({host_extra}) ({'ok' if good else 'FAIL'}) |")
    f16_logits = {}
    for name, llm in (("window", windowed), ("none", no_window), ("host", host_window)):
        llm.eval(tokens)
        f16_logits[name] = np.array(llm.scores[: llm.n_tokens])
    good = bool(np.array_equal(f16_logits["window"], f16_logits["none"]))
    ok &= good
    rows.append(f"| its f16 rung: the logits of {len(tokens)} tokens against the same ladder without a "
                f"window on the device | {'bit-identical' if good else 'DIFFERENT'} |")
    last = {}
    for name, llm in (("window", windowed), ("none", no_window), ("host", host_window)):
        while llm.kv_lazy_info().phase != "q4_0":
            assert llm.kv_lazy_convert()
        llm.eval(tokens[:8])
        last[name] = np.array(llm.scores[llm.n_tokens - 8 : llm.n_tokens])
    agree, to_host = next_tokens(last["host"], last["window"])
    _, to_none = next_tokens(last["host"], last["none"])
    good = agree >= 7 and to_host < to_none and bool(np.all(np.isfinite(last["window"])))
    ok &= good
    rows.append("| on the q4_0 rung, 8 more tokens: the host's window against the device's window and "
                "against the device without one (mean KLD); the same top token as the host's window | "
                f"{to_host:.5f} and {to_none:.5f}; {agree} of 8 ({'ok' if good else 'FAIL'}) |")
    print("\n".join(rows))
    return 0 if ok else 1


# ---------------------------------------------------------------- the report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vulkan_check", description=__doc__)
    parser.add_argument("--device-checks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device_checks:
        return device_checks()

    t0 = time.monotonic()
    engine, wheel, t_engine = vulkan_engine()
    env = child_env(engine)
    summary = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True).stdout
    names = [line.split("=", 1)[1].strip() for line in summary.splitlines() if "deviceName" in line]
    device_line = names[0] if names else "?"

    check_body, check_ok = lazy_check(engine)  # first: it imports the Vulkan engine's llama_cpp here
    ops_body, ops_ok = backend_ops()
    from bench.machine import cpu_model
    dev = subprocess.run([sys.executable, "-m", "bench.vulkan_check", "--device-checks"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=3600)
    if dev.returncode not in (0, 1):
        raise RuntimeError(f"device checks failed ({dev.returncode}): {dev.stderr[-3000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        plan_out = Path(tmp) / "plan.md"
        plan = subprocess.run([sys.executable, "-m", "bench.plan_accuracy", "--placements",
                               "gpu-half,gpu-all", "--n-ctx", "1024,4096", "--out", str(plan_out)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
        if not plan_out.is_file():
            raise RuntimeError(f"plan accuracy failed ({plan.returncode}): {plan.stderr[-3000:]}")
        plan_body = plan_out.read_text().replace("\n## ", "\n### ")
        plan_body = plan_body.replace("# Memory plan vs llama.cpp's own allocation", "## The memory plan", 1)

    ok = check_ok and ops_ok and dev.returncode == 0 and plan.returncode == 0
    report = [
        f"<!-- make vulkan-check ({time.monotonic() - t0:.0f} s, of it {t_engine:.0f} s for the engine) -->",
        "# The lazy KV cache on Vulkan",
        "",
        f"`make vulkan-check` on {cpu_model()} ({os.cpu_count()} CPUs), Vulkan device "
        f"**{device_line}** (Mesa's lavapipe: Vulkan on the CPU, the device path without a GPU), engine "
        f"`{wheel}`.",
        "",
        "## The ladder and a refused restore on the device",
        "",
        "| check | result |",
        "|---|---|",
        dev.stdout.strip(),
        "",
        check_body.strip(),
        "",
        ops_body.strip(),
        "",
        plan_body.strip(),
        "",
        f"Result: {'PASS' if ok else 'FAIL'}",
        "",
    ]
    RESULTS.write_text("\n".join(report), encoding="utf-8")
    print("\n".join(report))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
