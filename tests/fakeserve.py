"""`tandem serve` and `tandem ui` as real server processes over the fake pair: the commands' own
options, checks and server, with no model to load, so a test starts one in seconds.

    python -m tests.fakeserve serve --port 8123 --api-key-file key.txt
    python -m tests.fakeserve ui --api --port 8124

With TANDEM_FAKE_PAIR=bytes in the environment, the pair is tests/serve_fakes.py's byte_pair
(grammars, response_format and tool calls work on it); with =agent, its agent_pair (answers as
a small tool-using model: tests/agent_fake.py).

With TANDEM_FAKE_STORES=1 the fake pair keeps what a real load keeps (app/runtime/open_pair.py):
the history of past requests, the controller's evidence and the calibrations, in the stores
the TANDEM_* variables name, keyed as `STORE_KEY`. With TANDEM_KILL_AT=STORE:STEP:N[:FRACTION]
the process kills itself (SIGKILL) in its Nth write of that store (responses, history,
evidence, calibrations, chats: the folder its TANDEM_<STORE> variable names), at that step of
models/atomic.py's write, after cutting the temporary file to FRACTION of its bytes at
"written" (tests/test_serve_kills.py). TANDEM_FAKE_DECODE_S=S makes each of the target's
decodes take S seconds more, so an answer streams long enough to be killed in the middle.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from app.cli import build_parser
from app.runtime.queue import GenerationQueue
from app.serve_cli import checked_max_queue, serve, serve_access
from app.runtime.holder import PairHolder
from app.ui_cli import page_start, serve_app, ui_access
from engine.errors import TandemError
from engine.pair import Pair
from models import atomic
from models.tuned import PairKey
from tests.serve_fakes import agent_pair, byte_pair, fake_pair

# The fake pair's stand-in for its files' hashes, which key its evidence and calibrations.
STORE_KEY = PairKey("f" * 64, "", "e" * 64)
# The tokenizer id its histories are kept under.
HISTORY_TOKENIZER = "fake"


def keep_stores(holder: PairHolder, pair: Pair) -> None:
    """The stores of a real load (app/runtime/open_pair.py), for the fake pair."""
    from loading.calibrations import CalibrationFile, calibrations_path
    from loading.evidence import identity, keep_evidence
    from loading.history import HistoryStore
    keep_evidence(pair, STORE_KEY)
    pair.knowledge.keep_calibrations_in(CalibrationFile(calibrations_path(STORE_KEY),
                                                        identity(STORE_KEY, pair)))
    holder.history = HistoryStore(HISTORY_TOKENIZER, holder.history_tokens)


def slowed(pair: Pair, seconds: float) -> None:
    """Each of the target's decodes `seconds` longer (a sleep: no CPU)."""
    backend = pair.target.backend
    decode = backend.decode

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return decode(*args, **kwargs)

    backend.decode = slow  # type: ignore[method-assign]


def kill_in_a_write(spec: str) -> None:
    """Set models/atomic.py's seam to kill this process as TANDEM_KILL_AT says."""
    store, step, nth, *fraction = spec.split(":")
    root = Path(os.environ[f"TANDEM_{store.upper()}"]).resolve()
    cut = float(fraction[0]) if fraction else 1.0
    seen = 0

    def hook(at: str, tmp: Path, out: Path) -> None:
        nonlocal seen
        if at != step or not Path(out).resolve().is_relative_to(root):
            return
        seen += 1
        if seen == int(nth):
            if at == "written":
                os.truncate(tmp, int(tmp.stat().st_size * cut))
            os.kill(os.getpid(), signal.SIGKILL)

    atomic.on_step = hook


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        kind = os.environ.get("TANDEM_FAKE_PAIR")
        pair = byte_pair() if kind == "bytes" else agent_pair() if kind == "agent" else fake_pair()
        holder = PairHolder(pair, queue=GenerationQueue(checked_max_queue(args.max_queue)))
        if os.environ.get("TANDEM_FAKE_DECODE_S"):
            slowed(pair, float(os.environ["TANDEM_FAKE_DECODE_S"]))
        if os.environ.get("TANDEM_FAKE_STORES") == "1":
            keep_stores(holder, pair)
        if os.environ.get("TANDEM_KILL_AT"):
            kill_in_a_write(os.environ["TANDEM_KILL_AT"])
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
