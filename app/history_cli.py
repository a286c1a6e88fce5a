"""`tandem history`: what the history of past prompts and answers holds on disk, and
`tandem history clear` to delete it (loading/history.py). Hybrid and suffix draft from it;
`--no-history` (and the app's setting) neither reads nor writes it."""
from __future__ import annotations

import argparse

from loading.history import clear_histories, history_files, history_root
from models.found import size_text


def cmd_history(args: argparse.Namespace) -> int:
    root = history_root()
    if args.action == "clear":
        gone = clear_histories(root)
        total = sum(f.size for f in gone)
        print(f"deleted {len(gone)} histor{'y' if len(gone) == 1 else 'ies'} "
              f"({size_text(total)}) from {root}" if gone else f"no history in {root}")
        return 0
    files = history_files(root)
    if not files:
        print(f"no history in {root}")
        return 0
    print(f"histories in {root} (per model vocabulary; 'local' is the app's and the command "
          "line's, 'key-...' an API key's):")
    for f in files:
        print(f"  {f.tokenizer}/{f.path.name}  {size_text(f.size)}")
    return 0


def register(sub) -> None:
    h = sub.add_parser("history", help="show or clear the history of past requests that "
                       "hybrid and suffix draft from")
    h.add_argument("action", nargs="?", choices=("show", "clear"), default="show",
                   help="show (default) lists the files; clear deletes every one")
    h.set_defaults(func=cmd_history)
