"""`tandem adapt`: train the draft toward its target on the user's own prompts (issue 45), prove
it on held-out prompts, and keep it in the store with the pairing record, which makes it the
default only where it won (bench/adapt/run.py has the run's order and rules)."""
from __future__ import annotations

import argparse
import sys
import time

from app.runtime.adapt import run_adapt, user_prompts
from app.runtime.defaults import ADAPT_DECLINE_ABOVE
from app.settings import add_model_args, model_configs
from bench.adapt import data, train
from bench.adapt.settings import Settings
from bench.benchmark.suite import DEFAULT_SUITE


class _Terminal:
    """Progress on stderr, one line rewritten in place; other lines on stdout."""

    def line(self, text: str) -> None:
        print(text)

    def stage(self, what: str):
        start = time.monotonic()

        def show(i: int, n: int) -> None:
            done = time.monotonic() - start
            eta = done / i * (n - i)
            print(f"\r{what}: {i}/{n}, {done:.0f} s, about {eta:.0f} s left   ", end="",
                  file=sys.stderr, flush=True)
            if i == n:
                print(file=sys.stderr)
        return show

    def step(self, s: train.Step) -> None:
        print(f"\rtraining: step {s.done}/{s.total}, loss {s.loss:.3f}, {s.elapsed_s:.0f} s, "
              f"about {s.eta_s:.0f} s left   ", end="", file=sys.stderr, flush=True)
        if s.done == s.total:
            print(file=sys.stderr)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(train=args.train, epochs=args.epochs, context=args.context, lr=args.lr,
                    max_tokens=args.max_tokens, holdout=args.holdout,
                    holdout_per_category=args.holdout_per_category)


def cmd_adapt(args: argparse.Namespace) -> int:
    settings = settings_of(args)  # refused in one line before anything loads
    tcfg, dcfg = model_configs(args)
    result = run_adapt(tcfg, dcfg, user_prompts(args.prompts, args.category, tcfg),
                       settings, args.threads, _Terminal(), force=args.force)
    for line in result.lines:
        print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("adapt", help="train the draft toward its target on your prompts and "
                       "keep it where it accepts more on held-out prompts")
    add_model_args(a)
    a.add_argument("--prompts", help="prompts file (a suite JSONL, or one prompt per line); "
                   "default: the requests in your history")
    a.add_argument("--category", action="append", help="with a suite --prompts: its categories")
    a.add_argument("--holdout", default=str(DEFAULT_SUITE),
                   help="suite whose prompts (none trained on) the proof adds as other prompts "
                   "(default: the built-in suite)")
    a.add_argument("--holdout-per-category", type=int, default=2,
                   help="held-out suite prompts per category (default 2)")
    a.add_argument("--train", choices=train.CHOICES, default=train.DEFAULT_TRAIN,
                   help=f"which tensors train (default {train.DEFAULT_TRAIN}: the last 4 blocks "
                   "without the output head; head, head+last2: with it)")
    a.add_argument("--epochs", type=int, default=train.DEFAULT_EPOCHS,
                   help=f"passes over the teacher data (default {train.DEFAULT_EPOCHS})")
    a.add_argument("--context", type=int, default=train.DEFAULT_CONTEXT,
                   help=f"tokens per training window, a multiple of {train.CONTEXT_STEP} "
                   f"(default {train.DEFAULT_CONTEXT})")
    a.add_argument("--force", action="store_true",
                   help=f"train even where the base draft already accepts more than "
                   f"{ADAPT_DECLINE_ABOVE} per position on your requests (declined otherwise)")
    a.add_argument("--lr", type=float, default=train.DEFAULT_LR,
                   help=f"AdamW's learning rate (default {train.DEFAULT_LR:g})")
    a.add_argument("--max-tokens", type=int, default=data.ANSWER_TOKENS,
                   help=f"tokens per teacher answer (default {data.ANSWER_TOKENS})")
    a.set_defaults(func=cmd_adapt)

