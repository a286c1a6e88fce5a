"""`tandem`: the command line. It parses, calls the engine or the models library, and formats."""
from __future__ import annotations

import engine.llama.load_first  # noqa: F401  (before numpy: engine/llama/load_first.py)
# isort: split

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Generator

from app.adapt_cli import register as register_adapt
from app.bench_cli import register as register_bench
from app.calibrate_cli import register as register_calibrate
from app.history_cli import register as register_history
from app.runtime.defaults import PLAIN
from app.runtime.open_pair import open_pair
from app.runtime.request import RunSpec
from app.runtime.run import generate, prompt_tokens
from app.runtime.tuned import PairingUse, expected_acceptance, running_name, stale_line
from app.serve_cli import register as register_serve
from app.logprobs import rows as logprob_rows, table as logprob_table
from app.settings import (add_model_args, add_output_args, add_sampling_args,
                          add_speculation_args, load_options, model_configs, pair_request,
                          pairing_rule, request_spec)
from app.tune_cli import register as register_tune
from app.ui_cli import register as register_ui
from app.worker_cli import register as register_worker
from engine.errors import TandemError
from engine.events import DoneEvent, Event, TokenEvent
from engine.llama.quiet import quiet_llama
from engine.logprobs import TokenLogprob
from engine.staleness import StaleDraftEvent, watch
from models.cli import register as register_models


def cmd_generate(args: argparse.Namespace) -> int:
    # The request is checked before anything loads; the pairing record may then choose for it.
    spec = request_spec(args)
    tcfg, dcfg = model_configs(args, spec.drafter if args.drafter is not None else None)
    opened = open_pair(pair_request(args, tcfg, dcfg, load_options(
        args, [spec.drafter], early_exit_layers=args.early_exit_layers), pairing_rule(args)))
    pair, plan, use = opened.pair, opened.plan, opened.pairing
    try:
        if use.applied:
            spec = request_spec(args, use)
        expected = expected_acceptance(use, running_name(spec.drafter, plan))
        if spec.grammar is not None:
            # A schema or grammar llguidance refuses is refused before any decoding.
            pair.compile_grammar(spec.grammar)
        # Tokenized and refused when the context cannot hold it, once, before calibrating.
        tokens = prompt_tokens(pair, spec)
        history = opened.history if spec.history else None
        events = generate(pair, spec, tokens, history.index() if history else None)
        done, stale, logprobs = _run(events, expected if spec.drafter != PLAIN else None, args.json)
        if history is not None:
            history.save()
        lp_rows = (logprob_rows(logprobs, pair.target.backend.token_bytes)
                   if spec.logprobs is not None else None)
    finally:
        pair.close()
    _report(args, spec, use, Outcome(done, stale, lp_rows))
    return 0


@dataclass(frozen=True)
class Outcome:
    """What `tandem generate` reports: the answer and its stats, any staleness warning, and
    the tokens' log probabilities when --logprobs asked for them (app/logprobs.py's rows)."""
    done: DoneEvent
    stale: StaleDraftEvent | None
    logprobs: list[dict] | None


def _run(events: Generator[Event, None, None], expected: float | None, quiet: bool
         ) -> tuple[DoneEvent, StaleDraftEvent | None, list[TokenLogprob]]:
    """Print the answer as it comes (unless `quiet`) and any staleness warning; collect the
    tokens' log probabilities when the generation reports them."""
    done = stale = None
    logprobs: list[TokenLogprob] = []
    for ev in watch(events, expected):
        if isinstance(ev, TokenEvent):
            if ev.logprob is not None:
                logprobs.append(ev.logprob)
            if not quiet:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        elif isinstance(ev, StaleDraftEvent):
            stale = ev
            if not quiet:
                print(f"\n{stale_line(ev)}", file=sys.stderr)
        elif isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    return done, stale, logprobs


def _report(args: argparse.Namespace, spec: RunSpec, use: PairingUse, out: Outcome) -> None:
    if args.json:
        print(json.dumps({"text": out.done.text, "stats": out.done.stats.as_dict(),
                          "pairing": use.record.key.id if use.applied and use.record else None,
                          "stale": stale_line(out.stale) if out.stale else None,
                          "logprobs": out.logprobs}, indent=2))
        return
    s = out.done.stats
    forced = (f", {s.forced_tokens} forced by the grammar ({s.forced_tokens / s.output_tokens:.0%})"
              if s.forced_tokens and s.output_tokens else "")
    print(f"\n\n[{s.mode}] {s.output_tokens} tokens, {s.tokens_per_s:.2f} tok/s, "
          f"TTFT {s.ttft_ms:.0f} ms, prompt {s.prompt_tokens} tokens "
          f"({s.prompt_cached_tokens} from the cache, {s.prompt_computed_tokens} computed), "
          f"total {s.total_time_ms:.0f} ms{forced}"
          + (f", acceptance {s.acceptance_rate:.2f}, {s.tokens_per_target_call:.2f} tokens/target call"
             f", {s.drafter}/{spec.policy} mean gamma {sum(s.gammas) / max(len(s.gammas), 1):.1f}"
             f" ({s.gammas.count(0)} plain rounds)"
             + (f", prediction tokens {s.accepted_prediction_tokens} accepted, "
                f"{s.rejected_prediction_tokens} rejected" if spec.prediction else "")
             + f"; {s.reason}"
             if s.mode == "speculative" else ""), file=sys.stderr)
    if out.logprobs is not None:
        # On stderr with the statistics: stdout stays the answer (a schema's JSON parses).
        print(f"\nlog probabilities (the target's own, at temperature 1):\n"
              f"{logprob_table(out.logprobs)}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="Exact speculative decoding for local GGUF models.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    g.add_argument("--no-pairing", action="store_true",
                   help="ignore the pairing record `tandem tune` wrote for these files")
    add_model_args(g)
    add_sampling_args(g)
    add_speculation_args(g)
    add_output_args(g)
    g.set_defaults(func=cmd_generate)

    register_models(sub)
    register_ui(sub)
    register_bench(sub)
    register_serve(sub)
    register_tune(sub)
    register_adapt(sub)
    register_worker(sub)
    register_calibrate(sub)
    register_history(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_llama()
    try:
        return int(args.func(args) or 0)
    except TandemError as exc:
        # One line: llguidance's messages go on to quote the grammar's line under a caret.
        print(f"error: {next(iter(str(exc).splitlines()), '')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`tandem generate ... | head`). Point stdout at /dev/null so the
        # interpreter's last flush does not fail again with a traceback.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        print("error: the output was closed before the answer ended", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
