"""python -m bench.plan_accuracy: the memory plan against what llama.cpp allocates (issue 26).

For both test models × 3 context sizes × the 4 KV modes, on the CPU and over RPC (a local
ggml-rpc-server on 127.0.0.1, half of the layers and all of them) - or, with ``--placements
gpu-half,gpu-all``, on this machine's first GPU (``make vulkan-check``: Mesa's lavapipe) - loads the
model as the app does (EngineSession.load) and compares llama.cpp's own figures
(llama_get_memory_use, patch 0012) with ``lazykv.core.engine.planner.plan``, per buffer kind (weights,
KV cache, compute) and place (host memory, the device). Writes bench/results/plan_accuracy.md (``--out``
elsewhere); exit status 1 when an error is over 5 %.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from bench.device import start_server
from lazykv.core.engine.devices import local_gpus, rpc_devices
from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.engine.planner import Bytes, Device, plan
from lazykv.core.kinds import KvMode
from lazykv.core.models import model_fetch

RESULTS = Path(__file__).resolve().parent / "results" / "plan_accuracy.md"
MODELS = ("smollm2", "gemma3")
N_CTX = (1024, 4096, 8192)
PLACEMENTS = ("cpu", "rpc-half", "rpc-all")
GPU_PLACEMENTS = ("gpu-half", "gpu-all")  # this machine's first GPU, in place of an RPC server
TOLERANCE = 0.05
KINDS = ("weights", "kv", "compute")


@dataclass(frozen=True)
class Case:
    model: str
    n_ctx: int
    kv_mode: KvMode
    # "cpu", "rpc-half" (the output and half of the layers over RPC), "rpc-all"; "gpu-half", "gpu-all"
    placement: str

    def n_gpu_layers(self, n_layer: int) -> int:
        return {"cpu": 0, "half": n_layer // 2 + 1, "all": n_layer + 1}[self.placement.split("-")[-1]]


@dataclass(frozen=True)
class Row:
    case: Case
    n_gpu_layers: int
    place: str  # "host" or "device"
    kind: str
    measured: int
    planned: int

    @property
    def error(self) -> float:
        if self.measured == self.planned:
            return 0.0
        return (self.planned - self.measured) / self.measured if self.measured else float("inf")


def cases(models: Iterable[str] = MODELS, n_ctxs: Iterable[int] = N_CTX, modes: Iterable[str] = tuple(KvMode),
          placements: Iterable[str] = PLACEMENTS) -> list[Case]:
    return [Case(m, n, KvMode(k), p) for m in models for n in n_ctxs for k in modes for p in placements]


def model_path(name: str) -> Path:
    return model_fetch.models_dir() / model_fetch.MODELS[name].filename


def rpc_device(endpoint: str) -> Device:
    """The RPC server's device as the engine reports it (ggml_backend_dev_* of its registered device)."""
    return rpc_devices([endpoint])[0]


def measure(case: Case, endpoint: str | None) -> list[Row]:
    """Load the case's model as the app does; llama.cpp's figures and the plan's, per place and kind."""
    path = model_path(case.model)
    meta = read_model_meta(path)
    ngl = case.n_gpu_layers(meta.n_layer)
    session = EngineSession()
    gpu = case.placement.startswith("gpu")
    remote = case.placement.startswith("rpc")
    if remote and endpoint is None:
        raise ValueError(f"{case.placement} needs an RPC server")
    gpus = local_gpus()[:1] if gpu else []
    if gpu and not gpus:
        raise ValueError(f"{case.placement} needs a GPU the engine can offload to")
    info = session.load(LoadSpec(path, n_ctx=case.n_ctx, kv_mode=case.kv_mode, n_threads=2,
                        gpu_layers=ngl if gpu else 0,
                        rpc_servers=[endpoint] if remote and endpoint else (),
                        rpc_layers=ngl if ngl <= meta.n_layer else 0, kv_recent=0))
    try:
        measured = {
            "host": Bytes(*(sum(getattr(m, k) for m in info.memory if m.host) for k in KINDS)),
            "device": Bytes(*(sum(getattr(m, k) for m in info.memory if not m.host) for k in KINDS)),
        }
    finally:
        session.close()
    devices = (rpc_device(endpoint),) if remote and endpoint else tuple(gpus)
    p = plan(meta, case.n_ctx, case.kv_mode, devices, gpu_layers=ngl, available=1 << 50)
    planned = {"host": p.host, "device": Bytes(*(sum(getattr(d, k) for d in p.devices) for k in KINDS))}
    places = ("host", "device") if remote or gpu else ("host",)
    return [Row(case, ngl, place, kind, getattr(measured[place], kind), getattr(planned[place], kind))
            for place in places for kind in KINDS]


@contextmanager
def rpc_server() -> Iterator[str]:
    proc, endpoint = start_server()
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(selected: list[Case]) -> list[Row]:
    rows: list[Row] = []
    needs_rpc = any(c.placement.startswith("rpc") for c in selected)
    with rpc_server() if needs_rpc else _no_server() as endpoint:
        for case in selected:
            rows += measure(case, endpoint)
    return rows


@contextmanager
def _no_server() -> Iterator[None]:
    yield None


def worst(rows: Iterable[Row]) -> dict[tuple[str, str], Row]:
    """The row with the largest error for each (place, kind)."""
    out: dict[tuple[str, str], Row] = {}
    for row in rows:
        key = (row.place, row.kind)
        if key not in out or abs(row.error) > abs(out[key].error):
            out[key] = row
    return out


def report(rows: list[Row], command: str, seconds: float) -> str:
    mib = 1024 * 1024
    lines = [
        "# Memory plan vs llama.cpp's own allocation",
        "",
        f"`{command}` ({seconds:.0f} s), engine llama_cpp_python {llama_cpp.__version__}. The plan is",
        "`lazykv.core.engine.planner.plan` (pure, from the GGUF header); the reference is what the engine",
        "allocated (`llama_get_memory_use`, patch 0012) when the app loaded the model (`EngineSession.load`,",
        "n_ubatch 512, flash attention). RPC: a local `ggml-rpc-server` on 127.0.0.1 (CPU backend);",
        "`rpc-half` offloads the output layer and the last n_layer/2 layers, `rpc-all` every layer;",
        "`gpu-half` and `gpu-all` the same to this machine's first GPU.",
        f"Target: every figure within {TOLERANCE:.0%}.",
        "",
        "## Worst case per place and buffer kind",
        "",
        "| place | kind | worst error | case | measured MiB | planned MiB |",
        "|---|---|---:|---|---:|---:|",
    ]
    for (place, kind), row in sorted(worst(rows).items()):
        c = row.case
        lines.append(f"| {place} | {kind} | {row.error:+.2%} | {c.model} ctx {c.n_ctx} {c.kv_mode} "
                     f"{c.placement} | {row.measured / mib:.2f} | {row.planned / mib:.2f} |")
    over = [r for r in rows if abs(r.error) > TOLERANCE]
    verdict = "PASS" if not over else "MISS"
    lines += ["", f"**{verdict}**: {len(over)} of {len(rows)} figures over {TOLERANCE:.0%}.",
              "", "## Every case", "",
              "| model | ctx | KV | placement | ngl | place | weights MiB (err) | KV MiB (err) "
              "| compute MiB (err) |",
              "|---|---:|---|---|---:|---|---|---|---|"]
    by_case: dict[tuple[Case, str], dict[str, Row]] = {}
    for row in rows:
        by_case.setdefault((row.case, row.place), {})[row.kind] = row
    for (c, place), kinds in by_case.items():
        cells = " | ".join(f"{kinds[k].measured / mib:.2f} ({kinds[k].error:+.1%})" for k in KINDS)
        ngl = next(iter(kinds.values())).n_gpu_layers
        lines.append(f"| {c.model} | {c.n_ctx} | {c.kv_mode} | {c.placement} | {ngl} | {place} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_accuracy", description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--n-ctx", default=",".join(map(str, N_CTX)), help="context sizes, comma-separated")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help=f"of {', '.join(PLACEMENTS + GPU_PLACEMENTS)}, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    selected = cases(models=args.models.split(","), n_ctxs=[int(n) for n in args.n_ctx.split(",")],
                     placements=args.placements.split(","))
    t0 = time.monotonic()
    rows = run(selected)
    command = "python -m bench.plan_accuracy" + (f" {shlex.join(argv)}" if argv else "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(rows, command, time.monotonic() - t0))
    for (place, kind), row in sorted(worst(rows).items()):
        print(f"{place:6} {kind:8} worst {row.error:+.2%} ({row.case.model} ctx {row.case.n_ctx} "
              f"{row.case.kv_mode} {row.case.placement})")
    print(f"wrote {args.out}")
    return 1 if any(abs(r.error) > TOLERANCE for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
