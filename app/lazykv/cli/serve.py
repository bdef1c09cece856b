"""Serve the model over an OpenAI-compatible local API (KV cache kept across restarts)."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from lazykv.cli import _options
from lazykv.core.engine.engine_check import EngineMissingError, check_engine
from lazykv.core.engine.load_spec import LoadSpec, LoadSpecError
from lazykv.core.engine.types import ModelInfo
from lazykv.core.models.defaults import default_model_path
from lazykv.core.settings import Settings
from lazykv.server.settings import DEFAULT_HOST, DEFAULT_PORT, ServerSettings, is_loopback

API_KEY_ENV = "LAZYKV_API_KEY"
PASSPHRASE_ENV = "LAZYKV_PASSPHRASE"


class SetupError(Exception):
    """Said on stderr; the command exits with 2."""


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """``settings``: the user's, whose values the load options default to (--help says them)."""
    parser = argparse.ArgumentParser(
        prog="lazykv serve", description=__doc__,
        epilog=f"The API key may also come from ${API_KEY_ENV}; the snapshot passphrase (when the OS "
               f"keyring is not available) from ${PASSPHRASE_ENV} or a prompt.",
    )
    parser.add_argument("--model", type=Path, metavar="PATH",
                        help="GGUF model (default: the app's model, else SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}; any other needs --api-key)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--api-key", metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on /v1 (other users can read a command "
                             f"line in the process list; ${API_KEY_ENV} they cannot)")
    parser.add_argument("--no-encryption", action="store_true",
                        help="keep API cache snapshots unencrypted (checksummed only)")
    parser.add_argument("--no-api-cache", action="store_true",
                        help="keep no KV snapshots on disk (the cache is reused in memory only)")
    cache_gib = (settings or Settings())["api_cache_mb"] / 1024  # the app's Local API setting
    parser.add_argument("--api-cache-gib", type=float, default=cache_gib, metavar="GIB",
                        help="disk budget of the API cache; the least recently used snapshots go past it "
                             f"(default {cache_gib:g}, the app's setting)")
    parser.add_argument("--api-cache-dir", type=Path, metavar="DIR",
                        help="where the API cache lives (default: the app's data folder, api-cache)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN (repeatable; CORS is off without it)")
    cap, queue = (ServerSettings.model_fields[name].default for name in ("max_tokens_cap", "queue_size"))
    parser.add_argument("--max-tokens-cap", type=int, default=cap, metavar="N",
                        help=f"most tokens one reply may ask for (default {cap})")
    parser.add_argument("--queue-size", type=int, default=queue, metavar="N",
                        help=f"requests running or waiting; one more is answered 429 (default {queue})")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    _options.add_setting_options(parser, current=settings)
    return parser


def main(argv: list[str]) -> int:
    settings = Settings.load()
    args = build_parser(settings).parse_args(argv)
    try:
        return _serve(args, served_spec(args, settings))
    except SetupError as err:
        print(f"lazykv serve: {err}", file=sys.stderr)
        return 2


def served_spec(args: argparse.Namespace, settings: Settings) -> LoadSpec:
    """What the server loads: what the app would (its settings and model), the options given on top."""
    model = args.model or settings["model_path"] or default_model_path()
    try:
        return _options.spec(args, settings, model)
    except LoadSpecError as err:
        raise SetupError(str(err)) from None


def loaded_line(info: ModelInfo, spec: LoadSpec) -> str:
    """What was loaded, in one line: the model, its context and KV cache, where its layers are."""
    plan = info.plan
    most = plan.n_layer + 1 if plan.n_layer else 0
    places = ", ".join(d.device.name for d in plan.devices) if plan.devices else ""
    backend = (f"{plan.n_gpu_layers} of {most} layers on {places}" if plan.n_gpu_layers and places
               else "CPU only")
    window = (f", in 16-bit {spec.window_words()}" if info.kv_mode.is_lazy and spec.lazy_window
              else ", no recent window" if info.kv_mode.is_lazy else "")
    note = f" ({info.plan_note})" if info.plan_note else ""
    return (f"{info.name}: context {info.n_ctx} tokens, {info.kv_mode} KV cache{window}; "
            f"{backend}{note}")


def _serve(args: argparse.Namespace, spec: LoadSpec) -> int:
    from lazykv.core.paths import api_cache_dir

    try:
        settings = ServerSettings(
            host=args.host, port=args.port, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            cors_origins=tuple(args.cors_origin), max_tokens_cap=args.max_tokens_cap,
            queue_size=args.queue_size,
            cache_dir=None if args.no_api_cache else (args.api_cache_dir or api_cache_dir()),
            cache_budget_bytes=int(args.api_cache_gib * 1024**3),
        )
    except ValidationError as err:
        raise SetupError(err.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")) from None
    try:
        check_engine()
    except EngineMissingError as err:
        raise SetupError(str(err)) from None
    crypto = None if settings.cache_dir is None else snapshot_crypto(args.no_encryption)

    from lazykv.core.engine.engine import EngineSession
    from lazykv.core.errors import EngineError
    from lazykv.server.service import Service

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    session = EngineSession()
    try:
        info = session.load(spec)
    except EngineError as err:
        raise SetupError(str(err)) from None
    try:
        service = Service(settings, session, crypto, log_level=args.log_level)
        print(f"LazyKV API at {settings.base_url}: {loaded_line(info, spec)}", file=sys.stderr)
        if service.cache is not None:
            print(f"API cache: {service.cache.folder} ({crypto.scheme if crypto else 'none'}, budget "
                  f"{args.api_cache_gib:g} GiB)", file=sys.stderr)
        if not is_loopback(settings.host):
            print(f"Listening on {settings.host}: other machines can reach this server; every /v1 request "
                  "needs the API key.", file=sys.stderr)
        service.run()
    except OSError as err:
        raise SetupError(f"cannot listen on {settings.host}:{settings.port}: {err.strerror or err}") from None
    finally:
        session.close()
    return 0


def snapshot_crypto(no_encryption: bool):  # -> Crypto (imported lazily: keyring, cryptography)
    """How API cache snapshots are protected: the OS keyring's key, else a passphrase (environment or
    prompt), or none when asked in so many words. Never plain text by default."""
    from lazykv.core.history.keys import KeyringUnavailableError, PassphraseError, load_or_create_key
    from lazykv.core.history.protection import (
        keyring_crypto,
        passphrase_crypto,
        passphrase_lock,
        unlock_or_create,
    )
    from lazykv.core.history.protection import no_encryption as unencrypted

    if no_encryption:
        return unencrypted()
    try:
        return keyring_crypto(load_or_create_key())
    except KeyringUnavailableError as err:
        reason = str(err)
    lock = passphrase_lock()
    passphrase = os.environ.get(PASSPHRASE_ENV)
    if passphrase is None:
        if not sys.stdin.isatty():
            raise SetupError(f"{reason} Set ${PASSPHRASE_ENV}, run it in a terminal to type a passphrase, or "
                             "pass --no-encryption (or --no-api-cache).")
        passphrase = getpass.getpass("Snapshot passphrase: ")
    try:
        again = None
        if not lock.is_set():
            again = passphrase if PASSPHRASE_ENV in os.environ else getpass.getpass("Type it again: ")
        unlocked = unlock_or_create(lock, passphrase, again)
    except PassphraseError as err:
        raise SetupError(str(err)) from None
    return passphrase_crypto(unlocked)
