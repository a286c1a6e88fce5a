"""`tandem ui`: serve the app on a local address with the embedded pair (or --target/--draft).

The page comes up at once; the models load in the background and the page shows the progress,
or the reason when loading fails (missing file, does not fit, incompatible pair). With --api
the OpenAI-compatible API is served beside the page by the same server and takes its turns from
the same generation queue as the page.
"""
from __future__ import annotations

import argparse

from app.serve.access import KEY_FILE_OPTION, KEY_OPTION, Access
from app.runtime.queue import GenerationQueue
from app.serve_cli import (access_from_args, add_api_args, add_network_args, api_key,
                           checked_max_queue)
from app.runtime.open_pair import print_plan
from app.runtime.loader_settings import LoaderSettings, layers_text
from app.settings import add_history_args, add_model_args, load_options, model_configs
from engine.errors import SettingsError
from models import embedded, other_stores

DEFAULT_PORT = 7860
# The page is open to whoever passes the Host and Origin checks; the key guards the API.
KEYED_PATHS = ("/v1",)


def cmd_ui(args: argparse.Namespace) -> int:
    # Gradio (and FastAPI) take about 2 s to import: only this command pays for them, not
    # `tandem --help` and the others.
    from app.runtime.holder import PairHolder

    access = ui_access(args)
    # The page's Models tab searches the --models-dir folders too.
    other_stores.extend_models_dirs(args.models_dir)
    holder = PairHolder(queue=GenerationQueue(checked_max_queue(args.max_queue)),
                        history_tokens=None if args.no_history else args.history_tokens,
                        announce=print_plan)
    holder.reasoning_format = args.reasoning_format
    options = load_options(args, early_exit=args.early_exit,
                           early_exit_layers=args.early_exit_layers)
    holder.prepare_async(lambda: model_configs(args), options)
    return serve_app(holder, access, args.api, start=page_start(args))


def page_start(args: argparse.Namespace):
    """What the page's Models tab starts from: this command's own model options (the embedded
    pair where --target and --draft are not given; the first LoRA adapter of each model)."""
    from app.ui.wizard import Start

    draft = "" if args.draft == "none" else args.draft or str(embedded.DRAFT.path)
    settings = LoaderSettings(layers_text(args.gpu_layers), layers_text(args.draft_gpu_layers),
                              args.ctx, args.flash_attn, args.kv_type)
    return Start(args.target or str(embedded.TARGET.path), draft, settings,
                 (args.lora[0] if args.lora else "", args.lora_scale),
                 (args.draft_lora[0] if args.draft_lora else "", args.draft_lora_scale))


def ui_access(args: argparse.Namespace) -> Access:
    if not args.api and (args.api_key is not None or args.api_key_file is not None):
        raise SettingsError(f"{KEY_OPTION} and {KEY_FILE_OPTION} protect the API: add --api")
    # $TANDEM_API_KEY is read only when there is an API to protect.
    return access_from_args(args, api_key(args) if args.api else None, keyed=KEYED_PATHS)


def serve_app(holder, access: Access, api: bool, start=None) -> int:
    """Serve the page (and the API) over `holder` until Ctrl-C, then close the pair; `start`:
    what the Models tab starts from (`page_start`). The lines below are printed while the
    models may still be loading (engine/llama/backend.py keeps the process's streams where
    they are)."""
    from app.serve.routes import api_router
    from app.serve.server import launch
    from app.ui import build_app, page_mounter

    try:
        running = launch(page_mounter(build_app(holder, start=start)), access,
                         api_router(holder, holder.queue) if api else None)
        print(f"Tandem is running at {running.url}  (Ctrl-C to stop)", flush=True)
        if api:
            print(f"OpenAI-compatible API at {running.url}v1", flush=True)
        for line in access.notes():
            print(line, flush=True)
        running.wait()
    finally:
        holder.close()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ui", help="start the chat app in the browser")
    add_network_args(p, DEFAULT_PORT)
    p.add_argument("--api", action="store_true",
                   help="also serve the OpenAI-compatible API (/v1) from the same process")
    add_api_args(p)
    add_model_args(p)
    add_history_args(p.add_argument_group("history"))
    p.add_argument("--early-exit", action="store_true",
                   help="also offer the early-exit drafter (derives the target's first layers)")
    p.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers in the early-exit draft (default: three quarters)")
    p.set_defaults(func=cmd_ui)
