"""`tandem serve` and `tandem ui` as real server processes over the fake pair: the commands' own
options, checks and server, with no model to load, so a test starts one in seconds.

    python -m tests.fakeserve serve --port 8123 --api-key-file key.txt
    python -m tests.fakeserve ui --api --port 8124

With TANDEM_FAKE_PAIR=bytes in the environment, the pair is tests/serve_fakes.py's byte_pair
(grammars, response_format and tool calls work on it); with =agent, its agent_pair (answers as
a small tool-using model: tests/agent_fake.py).
"""
from __future__ import annotations

import os
import sys

from app.cli import build_parser
from app.runtime.queue import GenerationQueue
from app.serve_cli import checked_max_queue, serve, serve_access
from app.runtime.holder import PairHolder
from app.ui_cli import page_start, serve_app, ui_access
from engine.errors import TandemError
from tests.serve_fakes import agent_pair, byte_pair, fake_pair


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        kind = os.environ.get("TANDEM_FAKE_PAIR")
        pair = byte_pair() if kind == "bytes" else agent_pair() if kind == "agent" else fake_pair()
        holder = PairHolder(pair, queue=GenerationQueue(checked_max_queue(args.max_queue)))
        if args.command == "serve":
            return serve(holder, serve_access(args))
        if args.command == "ui":
            return serve_app(holder, ui_access(args), args.api, start=page_start(args))
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"error: tests.fakeserve runs serve or ui, not {args.command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
