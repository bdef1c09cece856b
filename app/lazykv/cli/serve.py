"""Serve the model over an OpenAI-compatible local API (KV cache kept across restarts)."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from lazykv.core.engine.engine_check import EngineMissingError, check_engine
from lazykv.core.kinds import DEFAULT_KV_MODE, KvMode
from lazykv.core.models import model_fetch

API_KEY_ENV = "LAZYKV_API_KEY"
PASSPHRASE_ENV = "LAZYKV_PASSPHRASE"
DEFAULT_CTX = 4096


class SetupError(Exception):
    """Said on stderr; the command exits with 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lazykv serve", description=__doc__,
        epilog=f"The API key may also come from ${API_KEY_ENV}; the snapshot passphrase (when the OS "
               f"keyring is not available) from ${PASSPHRASE_ENV} or a prompt.",
    )
    parser.add_argument("--model", type=Path, metavar="PATH",
                        help="GGUF model (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--api-key", metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on /v1 (other users can read a command "
                             f"line in the process list; ${API_KEY_ENV} they cannot)")
    parser.add_argument("--ctx", type=int, default=DEFAULT_CTX, metavar="N",
                        help=f"context size in tokens (default {DEFAULT_CTX})")
    parser.add_argument("--kv", choices=tuple(KvMode), default=str(DEFAULT_KV_MODE),
                        help=f"KV cache mode (default {DEFAULT_KV_MODE})")
    parser.add_argument("--threads", type=int, default=0, metavar="N", help="engine threads (default: all)")
    parser.add_argument("--no-encryption", action="store_true",
                        help="keep API cache snapshots unencrypted (checksummed only)")
    parser.add_argument("--no-api-cache", action="store_true",
                        help="keep no KV snapshots on disk (the cache is reused in memory only)")
    parser.add_argument("--api-cache-gib", type=float, default=2.0, metavar="GIB",
                        help="disk budget of the API cache; the least recently used snapshots go past it "
                             "(default 2)")
    parser.add_argument("--api-cache-dir", type=Path, metavar="DIR",
                        help="where the API cache lives (default: the app's data folder, api-cache)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN (repeatable; CORS is off without it)")
    parser.add_argument("--max-tokens-cap", type=int, default=4096, metavar="N",
                        help="most tokens one reply may ask for (default 4096)")
    parser.add_argument("--queue-size", type=int, default=8, metavar="N",
                        help="requests running or waiting; one more is answered 429 (default 8)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _serve(args)
    except SetupError as err:
        print(f"lazykv serve: {err}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from lazykv.core.history.connection import data_dir
    from lazykv.server.settings import ServerSettings

    try:
        settings = ServerSettings(
            host=args.host, port=args.port, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            cors_origins=tuple(args.cors_origin), max_tokens_cap=args.max_tokens_cap,
            queue_size=args.queue_size,
            cache_dir=None if args.no_api_cache else (args.api_cache_dir or data_dir() / "api-cache"),
            cache_budget_bytes=int(args.api_cache_gib * 1024**3),
        )
    except ValidationError as err:
        raise SetupError(err.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")) from None
    try:
        check_engine()
    except EngineMissingError as err:
        raise SetupError(str(err)) from None
    crypto = None if settings.cache_dir is None else snapshot_crypto(args.no_encryption)
    model = args.model or model_fetch.models_dir() / model_fetch.MODELS["smollm2"].filename

    from lazykv.core.engine.engine import EngineError, EngineSession
    from lazykv.server.service import Service

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    session = EngineSession()
    try:
        info = session.load(model, n_ctx=args.ctx, kv_mode=args.kv, n_threads=args.threads or None)
    except EngineError as err:
        raise SetupError(str(err)) from None
    try:
        service = Service(settings, session, crypto, log_level=args.log_level)
        print(f"LazyKV API: {info.name}, context {info.n_ctx} tokens, {info.kv_mode} KV cache, at "
              f"{settings.base_url}", file=sys.stderr)
        if service.cache is not None:
            print(f"API cache: {service.cache.folder} ({crypto.scheme if crypto else 'none'}, budget "
                  f"{args.api_cache_gib:g} GiB)", file=sys.stderr)
        if not _loopback(settings.host):
            print(f"Listening on {settings.host}: other machines can reach this server; every /v1 request "
                  "needs the API key.", file=sys.stderr)
        service.run()
    except OSError as err:
        raise SetupError(f"cannot listen on {settings.host}:{settings.port}: {err.strerror or err}") from None
    finally:
        session.close()
    return 0


def _loopback(host: str) -> bool:
    from lazykv.server.settings import is_loopback

    return is_loopback(host)


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
