"""`tandem serve`: load the pair once and serve the OpenAI-compatible API on a local address.

Loading happens before the server listens, so a bad file or a pair that does not fit ends
with one `error:` line like every other command, and a listening server is a ready one.
"""
from __future__ import annotations

import argparse

from app.runtime.tuned import apply, lookup
from app.runtime.queue import GenerationQueue
from app.settings import (add_draft_stop_args, add_model_args, draft_stops, load_options,
                          model_configs)
from engine.errors import SettingsError
from loading.load import load_pair

DEFAULT_MAX_QUEUE = 8


def cmd_serve(args: argparse.Namespace) -> int:
    # FastAPI and uvicorn, and Gradio under app.ui, take about 2 s to import: only this command
    # pays for them, not `tandem --help` and the others.
    from app.serve.server import create_app, run
    from app.runtime.holder import PairHolder

    queue = GenerationQueue(checked_max_queue(args.max_queue))
    tcfg, dcfg = model_configs(args)
    use = lookup(tcfg, dcfg)
    apply(args, use)
    if use.applied:
        tcfg, dcfg = model_configs(args, use.drafter)
    for line in use.messages:
        print(line, flush=True)
    options = (load_options(args, [use.drafter], early_exit_layers=args.early_exit_layers)
               if use.applied else load_options(args))
    pair = load_pair(tcfg, dcfg, options, **draft_stops(args))
    pair.preferred_drafter = use.drafter
    holder = PairHolder(pair, queue=queue)
    try:
        print(f"Tandem API at http://{args.host}:{args.port}/v1  (Ctrl-C to stop)", flush=True)
        run(create_app(holder, queue, args.api_key), args.host, args.port)
    finally:
        holder.close()
    return 0


def checked_max_queue(value: int) -> int:
    if value < 0:
        raise SettingsError(f"--max-queue must be >= 0, got {value}")
    return value


def add_api_args(p: argparse.ArgumentParser, default_queue: int | None = DEFAULT_MAX_QUEUE) -> None:
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on the /v1 routes")
    p.add_argument("--max-queue", type=int, default=default_queue,
                   help=f"requests that may wait while one generates; more get 503 "
                   f"(default {default_queue})")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    add_api_args(p)
    add_model_args(p)
    g = p.add_argument_group("speculation")
    add_draft_stop_args(g)
    g.add_argument("--no-pairing", action="store_true",
                   help="ignore the pairing record `tandem tune` wrote for these files")
    p.set_defaults(func=cmd_serve)
