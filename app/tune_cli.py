"""`tandem tune` and `tandem pairs`: measure the candidate drafters on the user's prompts and
machine, print the table, and keep the decision as a pairing record in the model store
(models/tuned.py); list the records."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from app.runtime.defaults import PLAIN
from app.runtime.prompt_sets import read_prompts
from bench.benchmark.suite import SuitePrompt
from engine.errors import SettingsError

# Tokens per tuning run: long enough for the adaptive controller to settle, short enough for a
# few prompts per candidate in ten minutes on a laptop CPU.
TUNE_MAX_TOKENS = 64


def tandem_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("tandem")
    except PackageNotFoundError:
        import tomllib
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, ValueError):
            return "unknown"


def tune_prompts(args: argparse.Namespace) -> list[SuitePrompt]:
    """--prompts FILE (a suite JSONL, or plain text with one prompt per line, category
    "prompts"), else the suite's --category prompts, else the whole default suite."""
    return read_prompts(args.prompts, args.category)


def _choice(row):
    from models.tuned import Choice
    return Choice(row.candidate, acceptance=row.acceptance, speedup_median=row.speedup.median,
                  speedup_p10=row.speedup.p10, n_prompts=row.n)


def _plain(n: int):
    from models.candidate import Candidate
    from models.tuned import Choice
    return Choice(Candidate(PLAIN, policy="plain", gamma=0), n_prompts=n)


def table_lines(results, cats: list[str]) -> list[str]:
    from bench.tuning.decide import OVERALL, choose, table
    lines = [f"{'candidate':<22}{'prompts':>8}{'accept':>8}{'draft cost':>11}"
             f"{'speedup':>9}{'p10':>7}  note"]
    for r in table(results):
        if r.n:
            # A candidate the policy never let draft has no acceptance or cost to show.
            acc, cost = ((f"{r.acceptance:>8.2f}", f"{r.draft_cost:>11.2f}") if r.drafted
                         else (f"{'-':>8}", f"{'-':>11}"))
            lines.append(f"{r.candidate.name:<22}{r.n:>8}{acc}{cost}"
                         f"{r.speedup.median:>8.2f}x{r.speedup.p10:>7.2f}  {r.note}")
        else:
            lines.append(f"{r.candidate.name:<22}{0:>8}{'':>8}{'':>11}{'':>9}{'':>7}  {r.note}")
    lines.append(f"{'plain':<22}{'':>8}{'':>8}{'':>11}{1.0:>8.2f}x{1.0:>7.2f}  reference")
    for cat in [OVERALL, *cats]:
        best = choose(results, cat)
        lines.append(f"best for {cat}: " + (f"{best.candidate.name} {best.speedup.median:.2f}x"
                                            if best else "plain (nothing beat plain decoding)"))
    return lines


def build_record(results, cats, key, tcfg, dcfg, args, params) -> object:
    from engine.llama.backend import default_threads
    from bench.tuning.decide import OVERALL, choose, row
    from models.tuned import PairingRecord
    from app.reports.machine import _cpu_model
    total = sum(len(r.runs) for r in results)

    def pick(cat: str):
        best = choose(results, cat)
        return _choice(best) if best else _plain(total)

    measured = {}
    for res in results:
        r = row(res)
        per_cat = [row(res, c) for c in cats]
        measured[res.candidate.name] = {
            "acceptance": r.acceptance,
            "acceptance_min": min((x.acceptance for x in per_cat if x.n), default=r.acceptance),
            "speedup_median": r.speedup.median, "speedup_p10": r.speedup.p10, "n": r.n,
            "note": r.note}
    lora = tcfg.lora
    return PairingRecord(
        key=key, target=tcfg.path, draft=dcfg.path if dcfg else "",
        adapter=",".join(p for p, _ in lora), adapter_scale=lora[0][1] if lora else 1.0,
        chosen=pick(OVERALL), by_category={c: pick(c) for c in cats}, measured=measured,
        machine={"device": "GPU" if tcfg.n_gpu_layers else "CPU",
                 "threads": tcfg.n_threads or default_threads(), "cpu": _cpu_model(),
                 "load_1min": round(os.getloadavg()[0], 2)},
        sampling={"temperature": params.temperature, "top_k": params.top_k,
                  "top_p": params.top_p, "min_p": params.min_p,
                  "max_tokens": args.max_tokens},
        tandem_version=tandem_version())


def cmd_tune(args: argparse.Namespace) -> int:
    from app.runtime.defaults import DEFAULT_DRAFTER, DRAFTERS
    from app.runtime.request import Offer, resolve
    from app.settings import model_configs, pair_request, request_settings
    from bench.tuning.candidates import default_candidates
    from bench.tuning.decide import categories
    from loading.options import LoadOptions
    from loading.plan import LoadPlan
    from bench.tuning.host import PairHost
    from app.runtime.open_pair import open_pair
    from app.runtime.tuned import PairingRule, key_for
    from models.tuned import save

    if args.budget_minutes <= 0:
        raise SettingsError(f"--budget-minutes must be positive, got {args.budget_minutes}")
    prompts = tune_prompts(args)
    # Every candidate drafts, so the settings are resolved as a speculative request's, with
    # or without a draft model.
    spec = resolve(request_settings(args), Offer(DRAFTERS, DEFAULT_DRAFTER, args.ctx))
    config = spec.config
    tcfg, dcfg = model_configs(args)
    key = key_for(tcfg.path, dcfg.path if dcfg else None, tcfg.lora, dcfg.lora if dcfg else ())
    candidates: list = []

    def choose(plan: LoadPlan) -> None:
        # Checked against the plan's headers before anything loads.
        candidates[:] = _candidates(args.candidates, default_candidates(
            dcfg is not None, plan.target_info.n_layer, policy=spec.policy or args.policy,
            gamma=config.gamma))

    # The draft as given: tuning decides whether a requantized or trimmed one is faster.
    opened = open_pair(pair_request(args, tcfg, dcfg, LoadOptions(
        check_budget=not args.no_budget_check, draft_quant="off", warmup=not args.no_warmup),
        PairingRule.ignored("tune measures the candidates itself")), announce=choose)
    pair, plan = opened.pair, opened.plan
    # The configs as placed: the record names the device the target ran on.
    tcfg, dcfg = plan.target, plan.draft
    print(f"tuning {len(candidates)} candidates on {len(prompts)} prompts "
          f"({', '.join(dict.fromkeys(p.category for p in prompts))}), budget "
          f"{args.budget_minutes:g} min, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    started = time.monotonic()
    try:
        results = _measure(PairHost(pair, tcfg, dcfg, max_tokens=config.max_tokens,
                                    stop=config.stop, plan=plan), candidates, prompts, config.params,
                           args.budget_minutes * 60)
    finally:
        pair.close()
    cats = categories(results)
    for line in table_lines(results, cats):
        print(line)
    record = build_record(results, cats, key, tcfg, dcfg, args, config.params)
    path = save(record)
    print(f"pairing record {path.name} written ({time.monotonic() - started:.0f} s, load "
          f"{os.getloadavg()[0]:.2f}); `tandem generate`, the app and `tandem serve` now use "
          f"{record.chosen.label} for this pair")
    return 0


def _measure(host, candidates: list, prompts: list, params, budget_s: float) -> list:
    """Every candidate on every prompt within the budget, with a progress bar and its ETA."""
    from tqdm import tqdm

    from bench.tuning.measure import measure

    with tqdm(total=len(candidates) * len(prompts), unit="pair", file=sys.stderr) as bar:
        def progress(p) -> None:
            bar.total = p.expected
            bar.update(p.done - bar.n)
            bar.set_postfix_str(f"{p.label}, ~{p.eta_s / 60:.1f} min left")
        return measure(host, candidates, prompts, params, budget_s=budget_s, progress=progress)


def _candidates(names: str | None, candidates: list) -> list:
    """The candidates --candidates names (comma-separated), all of them without it."""
    if not names:
        return candidates
    wanted = [c.strip() for c in names.split(",") if c.strip()]
    known = {c.name: c for c in candidates}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SettingsError(f"unknown candidate {unknown[0]!r}; choose from {', '.join(known)}")
    return [known[w] for w in wanted]


def cmd_pairs(args: argparse.Namespace) -> int:
    from models.tuned import all_records
    records = all_records()
    if not records:
        print("no pairing records; run `tandem tune`")
        return 0
    for r in records:
        adapter = f" + {Path(r.adapter).name}@{r.adapter_scale:g}" if r.adapter else ""
        draft = Path(r.draft).name if r.draft else "(no draft)"
        print(f"{r.key.id}  {r.date}  {Path(r.target).name}{adapter} / {draft}")
        c = r.chosen
        result = ("no candidate beat it" if c.candidate.drafter == PLAIN else
                  f"{c.speedup_median:.2f}x (p10 {c.speedup_p10:.2f}), acceptance {c.acceptance:.2f}")
        print(f"    chosen {c.label}: {result}; {r.machine.get('device', '?')} "
              f"{r.machine.get('threads', '?')} threads, Tandem {r.tandem_version}")
        for cat, c in r.by_category.items():
            print(f"      {cat}: {c.label}" + (f" {c.speedup_median:.2f}x" if c.candidate.drafter != PLAIN
                                               else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from app.runtime.defaults import DEFAULT_POLICY, LOOKUP_NGRAM
    from app.settings import add_draft_stop_args, add_model_args, add_sampling_args

    t = sub.add_parser("tune", help="measure drafters on your prompts and remember the fastest")
    t.add_argument("--prompts", help="prompts file: a suite JSONL, or one prompt per line")
    t.add_argument("--category", action="append",
                   help="suite categories to tune for (repeatable or comma separated)")
    t.add_argument("--budget-minutes", type=float, default=10.0,
                   help="time for all measurements (default 10)")
    t.add_argument("--policy", choices=("adaptive", "fixed", "heuristic"), default=DEFAULT_POLICY,
                   help=f"gamma policy of every candidate (default {DEFAULT_POLICY})")
    t.add_argument("--candidates", help="comma-separated candidate names to measure "
                   "(default all: draft, hybrid, draft-q8_0, draft-q4_k, draft-q4_0, "
                   "draft-vocab-trim, lookup, early-exit-K)")
    t.add_argument("--lookup-ngram", type=int, default=LOOKUP_NGRAM)
    add_draft_stop_args(t)
    add_model_args(t)
    add_sampling_args(t)
    t.set_defaults(func=cmd_tune, max_tokens=TUNE_MAX_TOKENS)

    p = sub.add_parser("pairs", help="list the pairing records `tandem tune` wrote")
    p.set_defaults(func=cmd_pairs)
