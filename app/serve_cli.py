"""`tandem serve`: load the pair once and serve the OpenAI-compatible API on a local address;
and the network and API options `tandem ui` shares with it.

Loading happens before the server listens, so a bad file or a pair that does not fit ends
with one `error:` line like every other command, and a listening server is a ready one.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from app.runtime.open_pair import open_pair
from app.serve.access import (HOSTS_ENV, HOSTS_OPTION, KEY_ENV, KEY_FILE_OPTION, KEY_OPTION,
                              ORIGINS_ENV, ORIGINS_OPTION, Access, display_url, parse_hosts,
                              parse_origins)
from app.runtime.defaults import PARALLEL, REASONING_FORMAT, REASONING_FORMATS
from app.runtime.queue import GenerationQueue
from app.settings import (add_draft_stop_args, add_history_args, add_model_args,
                          history_tokens, load_options, model_configs, pair_request, pairing_rule)
from engine.errors import SettingsError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_QUEUE = 8


def cmd_serve(args: argparse.Namespace) -> int:
    # FastAPI and uvicorn, and Gradio under app.ui, take about 2 s to import: only this command
    # pays for them, not `tandem --help` and the others.
    from app.runtime.holder import PairHolder

    # Options are checked before anything loads.
    access = serve_access(args)
    # Admits as many at once as the pair has slots (the holder sets it from the loaded pair).
    queue = GenerationQueue(checked_max_queue(args.max_queue))
    tcfg, dcfg = model_configs(args)
    opened = open_pair(pair_request(args, tcfg, dcfg, load_options(args), pairing_rule(args)))
    # The record's drafter, policy and gamma are what requests that choose none run with.
    holder = PairHolder(opened.pair, queue=queue, history_tokens=history_tokens(args),
                        pairing=opened.pairing)
    holder.offload = opened.plan.offload
    holder.history = opened.history
    holder.reasoning_format = args.reasoning_format
    return serve(holder, access)


def serve(holder, access: Access) -> int:
    """Serve the API over `holder`'s pair until Ctrl-C, then close the pair."""
    from app.serve.server import create_app, listen, run  # FastAPI and uvicorn: see cmd_serve

    try:
        sock = listen(access.host, access.port)
        print(f"Tandem API at {display_url(access.host, access.port)}v1  (Ctrl-C to stop)",
              flush=True)
        for line in access.notes():
            print(line, flush=True)
        run(create_app(holder, holder.queue, access), sock)
    finally:
        holder.close()
    return 0


def serve_access(args: argparse.Namespace) -> Access:
    # Every route but /health needs the key.
    return access_from_args(args, api_key(args), keyed=("/",))


def checked_max_queue(value: int) -> int:
    if value < 0:
        raise SettingsError(f"--max-queue must be >= 0, got {value}")
    return value


def add_network_args(p: argparse.ArgumentParser, default_port: int) -> None:
    g = p.add_argument_group("network")
    g.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0: every address, "
                   f"then list the names other machines use in {HOSTS_OPTION})")
    g.add_argument("--port", type=int, default=default_port, help=f"port (default {default_port})")
    g.add_argument(HOSTS_OPTION, action="append", default=None, metavar="NAME[,NAME...]",
                   help="host names or addresses, with an optional port, that requests may name "
                   "besides localhost, 127.0.0.1, [::1] and --host (repeatable; default: "
                   f"${HOSTS_ENV}, comma-separated)")
    g.add_argument(ORIGINS_OPTION, action="append", default=None, metavar="ORIGIN[,ORIGIN...]",
                   help="web pages (scheme://host[:port]) that may call this server from a "
                   "browser, besides its own page (repeatable; default: "
                   f"${ORIGINS_ENV}, comma-separated)")


def add_api_args(p: argparse.ArgumentParser, default_queue: int | None = DEFAULT_MAX_QUEUE) -> None:
    g = p.add_argument_group("API")
    g.add_argument(KEY_OPTION, default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (the process list shows it: prefer "
                   f"${KEY_ENV} or {KEY_FILE_OPTION})")
    g.add_argument(KEY_FILE_OPTION, default=None, metavar="PATH",
                   help="read the API key from this file")
    g.add_argument("--parallel", type=int, default=PARALLEL,
                   help="generations decoded together, each in its own slot of the models' "
                   f"caches (memory for one context each, and one more); 1: one at a time "
                   f"(default {PARALLEL})")
    g.add_argument("--max-queue", type=int, default=default_queue,
                   help=f"requests that may wait while --parallel generate; more get 503 "
                   f"(default {default_queue})")
    g.add_argument("--reasoning-format", choices=REASONING_FORMATS, default=REASONING_FORMAT,
                   help="a reasoning model's thinking (<think>...</think>, where its chat "
                   "template thinks): deepseek returns it apart from the answer (the API's "
                   "reasoning_content and reasoning items, the page's folded thoughts); none "
                   f"leaves it in the answer's text (default {REASONING_FORMAT}; a chat request's "
                   "reasoning_format overrides it)")


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $TANDEM_API_KEY (in that order), or None."""
    if args.api_key is not None and args.api_key_file is not None:
        raise SettingsError(f"give {KEY_OPTION} or {KEY_FILE_OPTION}, not both")
    if args.api_key_file is not None:
        path = Path(args.api_key_file)
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise SettingsError(f"cannot read {KEY_FILE_OPTION} {path}: {reason}") from None
        where = f"{KEY_FILE_OPTION} {path}"
    elif args.api_key is not None:
        key, where = args.api_key.strip(), KEY_OPTION
    else:
        # An empty variable counts as unset, as shells leave it after `export NAME=`.
        key, where = os.environ.get(KEY_ENV, "").strip() or None, KEY_ENV
    if key is None:
        return None
    if not key or any(c in key for c in "\r\n"):
        raise SettingsError(f"the API key in {where} must be one non-empty line")
    return key


def access_from_args(args: argparse.Namespace, key: str | None, keyed: tuple[str, ...]) -> Access:
    if not 0 < args.port < 65536:
        raise SettingsError(f"--port must be between 1 and 65535, got {args.port}")
    hosts = _listed(args.allowed_hosts, HOSTS_ENV)
    origins = _listed(args.allowed_origins, ORIGINS_ENV)
    return Access(host=args.host, port=args.port, allowed_hosts=parse_hosts(hosts),
                  allowed_origins=parse_origins(origins), api_key=key, keyed=keyed)


def _listed(given: list[str] | None, env: str) -> list[str]:
    """Comma-separated entries of a repeatable option, or of its environment variable."""
    values = given if given is not None else [os.environ.get(env, "")]
    return [entry.strip() for value in values for entry in value.split(",") if entry.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API")
    add_network_args(p, DEFAULT_PORT)
    add_api_args(p)
    add_model_args(p)
    g = p.add_argument_group("speculation")
    add_draft_stop_args(g)
    add_history_args(g)
    g.add_argument("--no-pairing", action="store_true",
                   help="ignore the pairing record `tandem tune` wrote for these files")
    p.set_defaults(func=cmd_serve)
