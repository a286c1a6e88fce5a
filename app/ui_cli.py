"""`tandem ui`: serve the app on a local address with the embedded pair (or --target/--draft).

The page comes up at once; the models load in the background and the page shows the progress,
or the reason when loading fails (missing file, does not fit, incompatible pair). With --api
the OpenAI-compatible API is mounted on the same FastAPI app and takes its turns from the same
generation queue as the page.
"""
from __future__ import annotations

import argparse

from app.runtime.queue import GenerationQueue
from app.serve_cli import add_api_args, checked_max_queue
from app.settings import add_model_args, load_options, model_configs
from engine.errors import SettingsError
from models import stores


def cmd_ui(args: argparse.Namespace) -> int:
    # Gradio (and FastAPI) take about 2 s to import: only this command pays for them, not
    # `tandem --help` and the others.
    from app.serve.server import mount
    from app.ui import build_app, launch
    from app.runtime.holder import PairHolder

    if args.api_key is not None and not args.api:
        raise SettingsError("--api-key protects the API: add --api")
    # The page's Models tab searches the --models-dir folders too.
    stores.extend_models_dirs(args.models_dir)
    holder = PairHolder(queue=GenerationQueue(checked_max_queue(args.max_queue)))
    options = load_options(args, early_exit=args.early_exit,
                           early_exit_layers=args.early_exit_layers)
    holder.prepare_async(lambda: model_configs(args), options)
    demo = build_app(holder)
    url = launch(demo, host=args.host, port=args.port)
    if args.api:
        mount(demo.app, holder, holder.queue, args.api_key)
    print(f"Tandem is running at {url}  (Ctrl-C to stop)", flush=True)
    if args.api:
        print(f"OpenAI-compatible API at {url.rstrip('/')}/v1", flush=True)
    try:
        demo.block_thread()
    finally:
        holder.close()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ui", help="start the chat app in the browser")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--api", action="store_true",
                   help="also serve the OpenAI-compatible API (/v1) from the same process")
    add_api_args(p)
    add_model_args(p)
    p.add_argument("--early-exit", action="store_true",
                   help="also offer the early-exit drafter (derives the target's first layers)")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers in the early-exit draft (default: three quarters)")
    p.set_defaults(func=cmd_ui)
