"""`tandem calibrate`: load the pair, measure its decode costs on this machine anew, to the 64
tokens a copy drafts (the calibration the adaptive controller starts from), keep them for every
later process of this pair and settings (loading/calibrations.py) and say where, and print them
with the predicted ceiling of speculation per gamma, for the draft model and for prompt lookup; where the draft model cannot pay, say what
might (app/runtime/ceiling_advice.py, which the page shares). With `--parallel N` the verify curve
is measured to the width N sequences reach, and a line per batch of 1..N says what gamma makes
the batch fastest. The figures are the engine's
(bench/ceiling.py); this module only formats them."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from app.runtime.ceiling_advice import MEASURED_AS_GIVEN, suggestions
from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_POLICY, PARALLEL
from app.runtime.open_pair import open_pair
from app.runtime.tuned import PairingRule
from app.runtime.defaults import COPY_MAX
from app.settings import (add_draft_stop_args, add_model_args, load_options, model_configs,
                          pair_request)
from bench.ceiling import TYPICAL_ACCEPTANCE, Ceiling, measure
from engine.control.costs import Calibration
from engine.drafters.base import PLAIN
from loading.calibrations import CalibrationFile



def _table(c: Ceiling, cal: Calibration, has_draft: bool) -> list[str]:
    verify, _ = cal.points()
    one = c.verify_ms[0]
    lines = ["verify cost per batch width (ms, measured; the widths between are interpolated): "
             + "  ".join(f"{w}: {v:.1f}" for w, v in verify.items()),
             "  relative to one token: "
             + " ".join(f"{w}: {v / one:.2f}" for w, v in verify.items())]
    if has_draft:
        lines.append(f"draft: {c.draft_ms[0]:.1f} ms a token, {c.draft_relative:.2f} of a "
                     "target token")
    lines.append(f"predicted speedup over plain decoding per gamma: every drafted token "
                 f"accepted / at acceptance {TYPICAL_ACCEPTANCE} / acceptance needed to break "
                 "even")
    head = "gamma | " + ("draft model               | " if has_draft else "") + "prompt lookup"
    lines.append(head)

    def cell(ceil: list[float], typical: list[float], even: list[float | None], g: int) -> str:
        need = f"{even[g - 1]:.2f}" if even[g - 1] is not None else "never"
        return f"{ceil[g]:5.2f}x {typical[g]:5.2f}x {need:>6}"

    for g in range(1, len(c.model)):
        row = f"{g:5d} | "
        if has_draft:
            row += cell(c.model, c.model_typical, c.model_break_even, g) + "     | "
        row += cell(c.lookup, c.lookup_typical, c.lookup_break_even, g)
        lines.append(row)
    return lines


def _batch_table(c: Ceiling, has_draft: bool) -> list[str]:
    """A line per batch of 1..N sequences: what a step of one row each costs, and the gamma at
    which all drafting alike makes the batch fastest (0: plain), with the batch's speedup."""
    if not c.batches:
        return []
    lines = [f"batches (--parallel {len(c.batches)}), every sequence drafting alike at acceptance "
             f"{TYPICAL_ACCEPTANCE}: the batch's best gamma and its speedup over plain batched",
             "sequences | one row each, x one row | "
             + ("draft model     | " if has_draft else "") + "prompt lookup"]
    for b in c.batches:
        row = f"{b.sequences:9d} | {b.plain_cost:22.2f} | "
        if has_draft:
            row += f"gamma {b.model_gamma} {b.model_speedup:5.2f}x | "
        lines.append(row + f"gamma {b.lookup_gamma} {b.lookup_speedup:5.2f}x")
    return lines


def _sequences(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of sequences >= 1, got {text!r}")
    return n


def kept_line(kept: CalibrationFile | None) -> str:
    """Where the calibration was kept, or why not."""
    if kept is None or kept.kept is None:
        return "the calibration was not kept: the store could not be written"
    if kept.kept != str(kept.path):
        return f"the calibration was not kept ({kept.kept}): run `tandem calibrate` again when " \
               "the machine is idle"
    return f"calibration kept in {kept.path}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    tcfg, dcfg = model_configs(args)
    request = pair_request(args, tcfg, dcfg, load_options(args, ["hybrid"]),
                           PairingRule.ignored(MEASURED_AS_GIVEN))
    opened = open_pair(replace(request, remeasure=True))
    pair = opened.pair
    try:
        # To the widest copy first (the drafter the ceiling reads: the default, else prompt
        # lookup); the ceiling below reads the same calibration (and measures wider only when
        # its batches reach past it).
        drafter = pair.default_drafter if pair.default_drafter != PLAIN else "lookup"
        pair.calibration(drafter, COPY_MAX)
        c = measure(pair, args.gamma, args.parallel)
        cal = pair.knowledge[drafter]
        draft_file = pair.draft_path
    finally:
        pair.close()
    has_draft = dcfg is not None
    tips = suggestions(c, has_draft)
    kept = opened.calibrations
    if args.json:
        verify, draft = cal.points()
        print(json.dumps({"target": tcfg.path, "draft": draft_file, "threads": tcfg.n_threads,
                          "ceiling": asdict(c), "model_pays": c.model_pays,
                          "lookup_pays": c.lookup_pays, "suggestions": tips,
                          "measured": {"verify": verify, "draft": draft}, "busy": cal.busy,
                          "kept": str(kept.path) if kept and kept.kept == str(kept.path)
                          else None}, indent=2))
        return 0
    print(f"target {Path(tcfg.path).name}" + (f", draft {Path(draft_file).name}" if draft_file
                                               else ", no draft model")
          + f", {tcfg.n_threads or 'all'} threads")
    print("\n".join(_table(c, cal, has_draft) + _batch_table(c, has_draft)))
    if has_draft:
        g = c.best(c.model_typical)
        verdict = ("pays" if c.model_pays else "cannot pay")
        print(f"the draft model {verdict} here: best {c.model_typical[g]:.2f}x at gamma {g} "
              f"at acceptance {TYPICAL_ACCEPTANCE}")
    if tips:
        print("what might pay instead:")
        print("\n".join(f"  - {t}" for t in tips))
    print(kept_line(kept))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="measure the pair's decode costs and predicted "
                       "speculation ceiling on this machine")
    add_model_args(c)
    add_draft_stop_args(c.add_argument_group("draft stops"))
    c.add_argument("--gamma", type=int, default=DEFAULT_GAMMA[DEFAULT_POLICY],
                   help=f"largest gamma to predict (default {DEFAULT_GAMMA[DEFAULT_POLICY]})")
    c.add_argument("--parallel", type=_sequences, default=PARALLEL,
                   help=f"sequences decoded together, as serve's --parallel (default {PARALLEL}): "
                   "the verify curve is measured to the width they reach, N x (gamma + 1)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_calibrate)
