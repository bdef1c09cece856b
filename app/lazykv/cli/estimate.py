"""The memory plan of a model: GPU layers, weights/KV/compute per place, the longest context per KV mode."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lazykv.core.engine.memory import MiB, fmt_bytes
from lazykv.core.engine.planner import AUTO, HOST_CPU, GpuLayers, Plan, max_ctx_per_mode, plan
from lazykv.core.errors import EngineError
from lazykv.core.kinds import DEFAULT_KV_RECENT, KvMode

DEFAULT_CTX = 4096


def _gpu_layers(text: str) -> GpuLayers:
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"“{text}” is neither auto nor a number of layers") from None
    if n < 0:
        raise argparse.ArgumentTypeError("the number of GPU layers cannot be negative")
    return n


def _mib(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"“{text}” is not a whole number of MiB") from None
    if n <= 0:
        raise argparse.ArgumentTypeError("the GPU memory limit must be more than 0 MiB")
    return n


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lazykv estimate", description=__doc__,
        epilog="Sizes are llama.cpp's own buffers (weights, KV cache, compute) as the engine would "
               "allocate them; nothing is loaded. --json prints one object: n_gpu_layers, fit, host, "
               "devices, max_ctx.")
    parser.add_argument("model", type=Path, help="a GGUF model file")
    parser.add_argument("--ctx", type=int, default=DEFAULT_CTX,
                        help=f"context length (default {DEFAULT_CTX})")
    parser.add_argument("--kv", choices=[m.value for m in KvMode], default=KvMode.LAZY.value,
                        help="KV cache mode (default lazy)")
    parser.add_argument("--gpu-layers", type=_gpu_layers, default=AUTO, metavar="auto|N",
                        help="layers on the GPU: auto (as many as fit, the default) or n_gpu_layers")
    parser.add_argument("--gpu-memory", type=_mib, default=None, metavar="MiB",
                        help="use at most this much memory of each device")
    parser.add_argument("--kv-recent", type=int, default=DEFAULT_KV_RECENT, metavar="N",
                        help="lazy and ladder: the recent f16 window, in tokens, counted with the KV cache "
                             f"(default {DEFAULT_KV_RECENT}, as the app; 0: none)")
    parser.add_argument("--rpc", default="", metavar="HOST:PORT[,...]",
                        help="llama.cpp RPC servers to offload to")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.ctx <= 0:
        parser.error("--ctx must be a positive number of tokens")
    if args.kv_recent < 0:
        parser.error("--kv-recent must be 0 or more tokens")

    from lazykv.core.engine.devices import discover  # loads the engine: after the arguments are checked
    from lazykv.core.engine.engine import read_checked_meta

    try:
        meta = read_checked_meta(args.model)
    except EngineError as err:
        print(f"estimate: {err}", file=sys.stderr)
        return 1
    support = meta.kv_support()
    if not support.allows(args.kv):
        print(f"estimate: a {args.kv} KV cache cannot run {args.model.name}: {support.reason}",
              file=sys.stderr)
        return 1
    endpoints = [e.strip() for e in args.rpc.split(",") if e.strip()]
    try:
        found = discover(endpoints)
    except ValueError as err:
        print(f"estimate: {err}", file=sys.stderr)
        return 1
    for gone in found.unreachable:
        print(f"estimate: left out {gone.endpoint}: {gone.reason}", file=sys.stderr)
    if found.note():
        print(f"estimate: {found.note()}", file=sys.stderr)
    gpu_memory = args.gpu_memory * MiB if args.gpu_memory else None
    p = plan(meta, args.ctx, args.kv, found.devices, args.gpu_layers, gpu_memory, recent=args.kv_recent)
    longest = max_ctx_per_mode(meta, found.devices, args.gpu_layers, gpu_memory, p.available, args.kv_recent)
    if args.json:
        print(json.dumps({**p.as_dict(), "max_ctx": {str(mode): n for mode, n in longest.items()}}))
    else:
        print(_text(args.model, p, longest))
    return 0


def _text(path: Path, p: Plan, longest: dict[KvMode, int]) -> str:
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
    return "\n".join(lines)
