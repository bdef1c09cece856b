"""The memory plan of a model: GPU layers, weights/KV/compute per place, the longest context per KV mode."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lazykv.cli import _options
from lazykv.core.engine.load_spec import LoadSpecError
from lazykv.core.engine.memory import ContextPlan, fmt_bytes
from lazykv.core.engine.planner import HOST_CPU, Plan
from lazykv.core.errors import EngineError
from lazykv.core.kinds import KvMode
from lazykv.core.settings import Settings


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lazykv estimate", description=__doc__,
        epilog="Sizes are llama.cpp's own buffers (weights, KV cache, compute) as the engine would "
               "allocate them with the app's settings (the options below change them); nothing is loaded. "
               "--json prints one object: n_gpu_layers, fit, host, devices, max_ctx, tokens_per_gib.")
    parser.add_argument("model", type=Path, help="a GGUF model file")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    _options.add_setting_options(parser, current=settings)
    return parser


def main(argv: list[str]) -> int:
    settings = Settings.load()
    parser = build_parser(settings)
    args = parser.parse_args(argv)
    try:
        spec = _options.spec(args, settings, args.model)
    except LoadSpecError as err:
        parser.error(str(err))

    from lazykv.core.engine.devices import discover  # loads the engine: after the arguments are checked
    from lazykv.core.engine.model_load import read_checked_meta

    try:
        meta = read_checked_meta(spec.model)
    except EngineError as err:
        print(f"estimate: {err}", file=sys.stderr)
        return 1
    support = meta.kv_support(spec.flash_attn)
    if not support.allows(spec.kv_mode):
        print(f"estimate: a {spec.kv_mode} KV cache cannot run {spec.model.name}: {support.reason}",
              file=sys.stderr)
        return 1
    try:
        found = discover(list(spec.rpc_servers))
    except ValueError as err:
        print(f"estimate: {err}", file=sys.stderr)
        return 1
    for gone in found.unreachable:
        print(f"estimate: left out {gone.endpoint}: {gone.reason}", file=sys.stderr)
    if found.note():
        print(f"estimate: {found.note()}", file=sys.stderr)
    p = spec.plan(meta, found.devices)
    longest = spec.max_ctx_per_mode(meta, found.devices, p.available)
    context = spec.context(meta)
    if args.json:
        print(json.dumps({**p.as_dict(), "max_ctx": {str(mode): n for mode, n in longest.items()},
                          "tokens_per_gib": {str(mode): n for mode, n in context.per_gib.items()}}))
    else:
        print(_text(spec.model, p, longest, context))
    return 0


def _text(path: Path, p: Plan, longest: dict[KvMode, int], context: ContextPlan) -> str:
    def parts(weights: int, kv: int, compute: int) -> str:
        return f"weights {fmt_bytes(weights)}, KV cache {fmt_bytes(kv)}, compute {fmt_bytes(compute)}"

    lines = [
        f"{path.name}, context {p.n_ctx}, KV {p.kv_mode}: {p.fit.value}",
        f"n_gpu_layers {p.n_gpu_layers} of {p.n_layer + 1 if p.n_layer else 0}: {p.reason}",
        f"{HOST_CPU}: {parts(p.host.weights, p.host.kv, p.host.compute)}; {fmt_bytes(p.available)} available",
    ]
    for d in p.devices:
        memory = (f"{fmt_bytes(d.device.free)} free of {fmt_bytes(d.device.total)}" if d.device.total
                  else "memory not reported")
        about = f" ({d.device.description})" if d.device.description else ""
        lines.append(f"{d.device.name}{about}: {parts(d.weights, d.kv, d.compute)}; {memory}")
    lines.append("longest context: " + ", ".join(f"{mode} {n}" for mode, n in longest.items()))
    lines += [f"  {context.figures(mode)}" for mode in KvMode]
    return "\n".join(lines)
