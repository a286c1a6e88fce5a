"""`tandem worker`: run llama.cpp's rpc-server so that another machine's Tandem can put target
layers here (`--rpc HOST:PORT`). The process becomes the rpc-server (exec): Ctrl-C stops it."""
from __future__ import annotations

import argparse
import os
import socket
import sys

from engine.errors import SettingsError
from engine.limits import MAX_THREADS
from engine.rpc import DEFAULT_PORT, parse_endpoints, probe_all
from loading import devices
from models import cli as models_cli
from models.rpc_server import find_rpc_server

SECURITY_WARNING = ("warning: the RPC protocol has no authentication and no encryption: whoever "
                    "reaches this port can use this machine's memory and CPU and read what it "
                    "computes. Run workers only on a trusted network.")


def worker_command(args: argparse.Namespace) -> list[str]:
    """The rpc-server command line for these options (checked first)."""
    if not 0 < args.port < 65536:
        raise SettingsError(f"port must be 1 to 65535, got {args.port}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise SettingsError(f"threads must be 1 to {MAX_THREADS}, got {args.threads}")
    cmd = [str(find_rpc_server()), "--host", args.host, "--port", str(args.port)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    return cmd


def check_port_free(host: str, port: int) -> None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def cmd_worker(args: argparse.Namespace) -> int:
    cmd = worker_command(args)
    check_port_free(args.host, args.port)
    here = args.host if args.host not in ("0.0.0.0", "::") else "THIS_MACHINE_ADDRESS"
    print(f"tandem worker: rpc-server on {args.host}:{args.port}\n"
          f"point Tandem at it from the machine with the draft:\n"
          f"  tandem generate --rpc {here}:{args.port} --prompt ...   (also bench, ui, serve;\n"
          f"  several workers: --rpc HOST1:PORT1,HOST2:PORT2; each serves one Tandem at a time)",
          flush=True)
    print(SECURITY_WARNING, file=sys.stderr, flush=True)
    if args.host == "127.0.0.1":
        print("(bound to 127.0.0.1: only this machine can reach it; --host ADDRESS to offer it "
              "to the network)", file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached


def cmd_budget(args: argparse.Namespace) -> int:
    """`tandem budget`, with `--rpc`: the workers probed (the models library stays off the
    network), then what each would hold."""
    return models_cli.cmd_budget(args, probe_all(parse_endpoints(args.rpc)) if args.rpc else (),
                                 devices.detect())


def register(subparsers: argparse._SubParsersAction) -> None:
    """`tandem worker`, and `--rpc` on `tandem budget` (registered before)."""
    b = subparsers.choices["budget"]
    b.add_argument("--rpc", metavar="HOST:PORT[,...]",
                   help="the target spread over these RPC workers: what each one holds")
    b.set_defaults(func=cmd_budget)
    p = subparsers.add_parser("worker", help="offer this machine's memory and CPU to another "
                              "Tandem's target over llama.cpp RPC (trusted networks only)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the layers computed here (default: half the cores, "
                   "rpc-server's default)")
    p.set_defaults(func=cmd_worker)
