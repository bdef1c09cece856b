"""Models on disk and on the Hugging Face Hub: list, search, get (download), with what fits this machine."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from lazykv.cli import _options
from lazykv.core.engine.load_spec import LoadSpec, LoadSpecError
from lazykv.core.engine.memory import fmt_bytes
from lazykv.core.engine.planner import Device
from lazykv.core.models import download as downloads
from lazykv.core.models.fit import FitReport, fit_report, local_devices
from lazykv.core.models.hub import Hub, HubError, HubModel, read_header, repo_models, search
from lazykv.core.models.record import human_params
from lazykv.core.models.scan import Places, scan
from lazykv.core.settings import Settings


def main(argv: list[str]) -> int:
    settings = Settings.load()
    parser = argparse.ArgumentParser(prog="python -m lazykv models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="the GGUF models other tools left on disk (nothing is copied)")
    listing.add_argument("--folder", action="append", default=[],
                         help="also scan this folder (repeatable; the Models page's folders are scanned too)")
    finding = commands.add_parser("search", help="GGUF repos on the Hub")
    finding.add_argument("query")
    finding.add_argument("--limit", type=int, default=20)
    getting = commands.add_parser("get", help="download a repo's model into the Hugging Face cache (a repo "
                                  "with several: their list, with sizes and what fits)")
    getting.add_argument("repo")
    getting.add_argument("--file", help="the model file to download (a split model: its first shard)")
    for sub in (listing, finding, getting):
        sub.add_argument("--json", action="store_true", help="one JSON document on stdout")
    for sub in (listing, getting):  # what fits is planned as the app would load it
        _options.add_setting_options(sub, current=settings)
    args = parser.parse_args(argv)
    try:
        spec = _options.spec(args, settings, settings["model_path"] or ".") if args.command != "search" \
            else None
    except LoadSpecError as err:
        parser.error(str(err))
    args.spec = spec
    try:
        return {"list": _list, "search": _search, "get": _get}[args.command](args)
    except HubError as err:
        print(f"models: {err}", file=sys.stderr)
        return 1


def _fit_json(report: FitReport | None) -> dict[str, Any] | None:
    return report.to_json() if report is not None else None


def _fit_text(report: FitReport | None) -> str:
    if report is None:
        return ""
    longest = ", ".join(f"{mode} {n}" for mode, n in report.max_ctx.items())
    return f"{report.word} at {report.n_ctx} ({report.kv_mode}); longest context: {longest}"


def _list(args: argparse.Namespace) -> int:
    result = scan(Places.current([*Settings.load()["model_folders"], *args.folder]))
    spec: LoadSpec = args.spec
    rows = []
    devices = local_devices()
    for r in result.records:
        report = fit_report(r.meta, spec, devices=devices) if r.meta is not None and r.usable \
            else None
        rows.append((r, report))
    if args.json:
        print(json.dumps({"models": [{**r.to_json(), "fit": _fit_json(f)} for r, f in rows],
                          "notes": list(result.notes)}, indent=1))
        return 0
    if not rows:
        print("No GGUF models found on disk. `python -m lazykv models search QUERY` finds some on the Hub.")
    for r, report in rows:
        print(f"{r.name}  [{r.source}: {r.label}]")
        if r.usable:
            template = "chat template" if r.has_chat_template else "no chat template"
            print(f"  {r.architecture}, {human_params(r.n_params)} parameters, {r.quant or '?'}, "
                  f"{fmt_bytes(r.size)}, trained context {r.n_ctx_train}, {template}"
                  + (f", {len(r.shards)} shards" if len(r.shards) > 1 else ""))
            print(f"  {_fit_text(report)}")
        else:
            print(f"  not offered: {r.problem}")
        print(f"  {r.path}")
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _search(args: argparse.Namespace) -> int:
    found = search(args.query, args.limit, Hub.from_env())
    if args.json:
        print(json.dumps([r.to_json() for r in found], indent=1))
        return 0
    if not found:
        print(f"No GGUF repos on the Hub match {args.query!r}.")
    for r in found:
        print(f"{r.repo_id}  ({r.downloads} downloads{', gated' if r.gated else ''})")
    return 0


def _get(args: argparse.Namespace) -> int:
    hub = Hub.from_env()
    if args.file:
        return _download(args, args.file, hub)
    models = repo_models(args.repo, hub)
    offered = [m for m in models if not m.problem]
    if len(offered) == 1 and not args.json:
        return _download(args, offered[0].name, hub)
    rows = []
    devices = local_devices()
    for m in models:
        report = _hub_fit(m, hub, args, devices) if not m.problem else None
        rows.append((m, report))
    if args.json:
        print(json.dumps([{**m.to_json(), "fit": _fit_json(f)} for m, f in rows], indent=1))
        return 0
    if not models:
        print(f"{args.repo} has no GGUF files.")
    for m, report in rows:
        shards = f", {len(m.files)} shards" if len(m.files) > 1 else ""
        print(f"{m.name}  {m.quant or '?'}, {fmt_bytes(m.size)}{shards}")
        print(f"  {('not offered: ' + m.problem) if m.problem else _fit_text(report)}")
    if rows:
        print(f"Download one with: python -m lazykv models get {args.repo} --file NAME")
    return 0 if not offered else 2  # several to choose from


def _hub_fit(model: HubModel, hub: Hub, args: argparse.Namespace, devices: list[Device]) -> FitReport | None:
    try:
        return fit_report(read_header(model, hub), args.spec, devices=devices)
    except (HubError, ValueError):
        return None


def _download(args: argparse.Namespace, filename: str, hub: Hub) -> int:
    job = downloads.start(args.repo, filename, Places.current(), hub)
    shown = 0.0
    try:
        while job.running:
            job.poll()
            now = time.monotonic()
            if not args.json and job.progress.total and now - shown > 0.5:
                print(f"\r{job.progress.describe():<60}", end="", file=sys.stderr, flush=True)
                shown = now
            time.sleep(0.1)
    except KeyboardInterrupt:
        job.cancel()
        print("\nmodels: cancelled; the next `get` of this file goes on where it stopped", file=sys.stderr)
        return 130
    if not args.json:
        print(file=sys.stderr)
    if job.state != "done" or job.path is None:
        assert job.error is not None
        raise job.error
    if args.json:
        print(json.dumps({"path": str(job.path), "size": job.progress.total}))
    else:
        print(job.path)
    return 0
