"""`tandem bench` and `tandem exactness`: parse, load the pair, run with a progress bar, write
the reports. `--quick` shrinks the defaults to a few-minute run; explicit options still win."""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from tqdm import tqdm

from app.reports import bench_markdown
from bench.benchmark import files as bench_files
from app.reports.machine import command_line, machine_line, run_context
from app.runtime.defaults import DEFAULT_GAMMA, DEFAULT_POLICY
from app.runtime.open_pair import open_pair
from app.runtime.tuned import PairingRule
from app.settings import (add_draft_stop_args, add_model_args, draft_stops, load_options,
                          model_configs, pair_request)
from app.reports import overhead_markdown
from bench.fakes.spelled import Spelling, byte_spelling, qwen_spelling
from bench.overhead import engine_time, grammar as grammar_overhead
from bench.overhead.banks import QWEN_VOCAB
from bench.benchmark.aggregate import summarize
from bench.benchmark.runner import HISTORY_MARK, BenchPlan, SpecConfig, run_benchmark
from bench.benchmark.suite import DEFAULT_SUITE, load_suite
from engine.errors import SettingsError
from engine.pair import Pair
from engine.sampling import SamplingParams
from models import embedded

# Short first lines ("Dog\n", "Elephant\n") keep samples cheap; the first animal varies a lot.
EXACTNESS_PROMPT = "Write a list of five animals, one per line."
BENCH_FULL = {"gammas": "2,4", "max_tokens": 64, "prompts_per_category": None}
BENCH_QUICK = {"gammas": "4", "max_tokens": 32, "prompts_per_category": 1}
# 10,000 answers per arm: what a bias of TV 0.03 at one position needs to be seen (the
# report prints the smallest bias each comparison could see at the count it ran).
EXACT_FULL = {"samples": 10_000, "greedy_prompts": 12, "greedy_tokens": 48}
OVERHEAD_TOKENS = 256
OVERHEAD_REPEATS = 5
EXACT_QUICK = {"samples": 40, "greedy_prompts": 2, "greedy_tokens": 16}


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _numbers(text: str, kind: type) -> list:
    try:
        return [kind(t) for t in _csv(text)]
    except ValueError:
        raise SettingsError(f"expected a comma-separated list of {kind.__name__}s, got {text!r}") from None


def _pick(args: argparse.Namespace, name: str, full: dict, quick: dict):
    """Option `name` as given, else its preset (--quick or full): both are keyed by the name."""
    value = vars(args)[name]
    if value is not None:
        return value
    return (quick if args.quick else full)[name]


def _out_dir(args: argparse.Namespace, kind: str) -> Path:
    if args.out:
        return Path(args.out)
    return Path("out") / f"{kind}-{dt.datetime.now():%Y%m%d-%H%M%S}"


def _load_pair(args: argparse.Namespace, drafters: list[str], why: str, chosen: str | None = None,
               early_exit_layers: int | None = None):
    """The pair for bench (several drafters) or exactness (one, `chosen`); the pairing record
    is not used, for the reason `why`."""
    tcfg, dcfg = model_configs(args, chosen)
    opened = open_pair(pair_request(args, tcfg, dcfg, load_options(
        args, drafters, early_exit_layers=early_exit_layers), PairingRule.ignored(why)))
    return opened.pair, tcfg, dcfg


def _model_words(args: argparse.Namespace) -> list[str]:
    words = []
    for flag, value in (("--target", args.target), ("--draft", args.draft),
                        ("--threads", args.threads), ("--ctx", args.ctx),
                        ("--batch", None if args.batch == 512 else args.batch),
                        ("--gpu-layers", args.gpu_layers),
                        ("--draft-gpu-layers", args.draft_gpu_layers)):
        if value is not None:
            words += [flag, str(value)]
    for flag, paths in (("--lora", args.lora), ("--draft-lora", args.draft_lora)):
        for path in paths:
            words += [flag, str(path)]
    for flag, scale in (("--lora-scale", args.lora_scale),
                        ("--draft-lora-scale", args.draft_lora_scale)):
        if scale != 1.0:
            words += [flag, f"{scale:g}"]
    if args.draft_quant is not None:
        words += ["--draft-quant", args.draft_quant]
    if args.draft_vocab is not None:
        words += ["--draft-vocab", args.draft_vocab]
    for flag, value in draft_stops(args).items():
        words += [f"--draft-{flag.replace('_', '-')}", str(value)]
    return words + (["--no-budget-check"] if args.no_budget_check else [])


def _draft_words(pair: Pair, dcfg) -> str:
    """The draft as given and, when it was requantized at load, the file actually used."""
    if dcfg is None:
        return "none"
    loaded = pair.draft_path
    if loaded and loaded != dcfg.path:
        return f"{dcfg.path} (loaded as {loaded})"
    return dcfg.path


def parse_configs(text: str) -> list[SpecConfig]:
    """`--configs`: DRAFTER[+history]:POLICY:GAMMA[:OPENING] items, comma separated."""
    items = [c.split(":") for c in _csv(text)]
    if any(len(t) not in (3, 4) for t in items):
        raise SettingsError("--configs takes DRAFTER:POLICY:GAMMA[:OPENING] items, e.g. "
                            "draft:fixed:3 or hybrid:adaptive:8:16")
    try:
        return [SpecConfig(t[0].removesuffix(HISTORY_MARK), int(t[2]), t[1],
                           int(t[3]) if len(t) == 4 else None,
                           history=t[0].endswith(HISTORY_MARK))
                for t in items]
    except ValueError as e:
        raise SettingsError(f"--configs: GAMMA and OPENING are whole numbers ({e})") from None


def cmd_overhead(args: argparse.Namespace) -> int:
    """`tandem bench --overhead`: the engine's own time per token over instant backends, then
    the constraint's own cost (path `json`)."""
    max_tokens = args.max_tokens or OVERHEAD_TOKENS
    repeats = args.repeats or OVERHEAD_REPEATS
    paths = _csv(args.overhead_paths) if args.overhead_paths else []
    free_paths = [p for p in paths if p != grammar_overhead.GRAMMAR_PATH]
    if not paths or free_paths:
        print(f"engine overhead: {len(free_paths) or len(engine_time.PATHS)} paths x "
              f"{len(engine_time.MODES)} samplings x {repeats} runs of {max_tokens} tokens at "
              f"{args.vocab:,} tokens ...", file=sys.stderr)
        rows, history = engine_time.run_overhead(n_vocab=args.vocab, max_tokens=max_tokens,
                                                 repeats=repeats, paths=free_paths)
        print(overhead_markdown.markdown(rows, args.vocab, machine_line(), history))
    if not paths or grammar_overhead.GRAMMAR_PATH in paths:
        spelling = _spelling(args.vocab)
        print(f"constraint overhead: {len(grammar_overhead.GRAMMAR_PATHS)} paths x "
              f"{len(grammar_overhead.GRAMMAR_MODES)} samplings x {repeats} runs of "
              f"{max_tokens} tokens, free and under a JSON schema, spelling with {spelling.name} ...", file=sys.stderr)
        grammar_rows = grammar_overhead.run_grammar_overhead(spelling, max_tokens=max_tokens,
                                                             repeats=repeats)
        if not paths or free_paths:
            print()
        print(overhead_markdown.grammar_markdown(grammar_rows, spelling, machine_line()))
    return 0


def _spelling(n_vocab: int) -> Spelling:
    """The embedded target's real vocabulary when it is on disk and the size asked for, else
    a byte-level table of `n_vocab` tokens."""
    path = embedded.TARGET.path
    if path.is_file() and n_vocab == QWEN_VOCAB:
        spelling = qwen_spelling(path)
        if spelling.n_vocab == n_vocab:
            return spelling
    return byte_spelling(n_vocab)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.overhead:
        return cmd_overhead(args)
    suite = load_suite(args.suite or DEFAULT_SUITE)
    categories = [c for group in args.categories or [] for c in _csv(group)]
    per_cat = _pick(args, "prompts_per_category", BENCH_FULL, BENCH_QUICK)
    chosen = suite.select(categories or None, per_cat)
    configs, drafters, sweep = _bench_configs(args)
    samplings = [SamplingParams(temperature=t, top_p=p)
                 for t in _numbers(args.temperatures, float)
                 for p in (_numbers(args.top_p, float) if t > 0 else [1.0])]
    samplings = list(dict.fromkeys(samplings))
    plan = BenchPlan(prompts=chosen.prompts, configs=configs, samplings=samplings,
                     max_tokens=_pick(args, "max_tokens", BENCH_FULL, BENCH_QUICK), seed=args.seed,
                     repeats=args.repeats or 1)
    out = _out_dir(args, "bench")
    pair, tcfg, dcfg = _load_pair(args, drafters, "bench compares drafters itself",
                                  early_exit_layers=args.early_exit_layers)
    draft_words = _draft_words(pair, dcfg)
    started = time.perf_counter()
    try:
        with tqdm(total=plan.total_runs, unit="run", file=sys.stderr) as bar:
            def progress(done: int, total: int, rec) -> None:
                bar.update(1)
                bar.set_postfix_str(f"{rec.prompt_id} {rec.config}"
                                    + (f" x{rec.speedup:.2f}" if rec.speedup else ""))
            records = run_benchmark(pair, plan, progress)
    finally:
        pair.close()
    words = ["bench"] + (["--suite", str(args.suite)] if args.suite else []) + [
        "--categories", ",".join(chosen.categories)] + sweep + [
        "--temperatures", args.temperatures, "--top-p", args.top_p,
        "--max-tokens", str(plan.max_tokens)] + (
        ["--prompts-per-category", str(per_cat)] if per_cat is not None else []) + [
        "--seed", str(plan.seed)] + (
        ["--repeats", str(plan.repeats)] if plan.repeats > 1 else []) + _model_words(args)
    context = {**run_context(command_line(words)), "target": tcfg.path,
               "draft": draft_words,
               "suite": f"{chosen.name} v{chosen.version} ({len(chosen.prompts)} prompts: "
                        f"{', '.join(chosen.categories)})",
               "plan": f"configs {', '.join(c.label for c in configs)}; sampling "
                       f"{', '.join(f't={s.temperature:g} top-p={s.top_p:g}' for s in samplings)}; "
                       f"max tokens {plan.max_tokens}; seed {plan.seed}; threads {args.threads or 'auto'}"
                       + (f"; {plan.repeats} runs of each, speedup of the medians"
                          if plan.repeats > 1 else ""),
               "wall_time": f"{time.perf_counter() - started:.0f} s"}
    _write_bench(out, records, context)
    return 0


def _bench_configs(args: argparse.Namespace) -> tuple[list[SpecConfig], list[str], list[str]]:
    """The configurations to measure, their drafters, and the options that name them in the
    report's command line."""
    if args.configs:
        configs = parse_configs(args.configs)
        return (configs, list(dict.fromkeys(c.drafter for c in configs)),
                ["--configs", ",".join(c.item for c in configs)])
    gammas = _numbers(_pick(args, "gammas", BENCH_FULL, BENCH_QUICK), int)
    drafters, policies = _csv(args.drafters), _csv(args.policies)
    configs = [SpecConfig(d, g, pol) for d in drafters for pol in policies for g in gammas]
    return configs, drafters, ["--drafter", ",".join(drafters), "--policies", ",".join(policies),
                               "--gammas", ",".join(map(str, gammas))]


def _write_bench(out: Path, records: list, context: dict) -> None:
    """The report, its plots, the runs as JSON and CSV, and the overall lines on stdout."""
    # Matplotlib takes about 0.3 s to import: only the command that plots pays for it.
    from app.reports import bench_plots

    summary = summarize(records)
    out.mkdir(parents=True, exist_ok=True)
    # The report keeps tables and plots, one per figure; the raw runs go to the user's cache.
    raw = bench_files.runs_dir(out)
    context["raw_runs"] = str(raw)
    plots = [bench_plots.speedup_by_category(records, out / "speedup_by_category.png"),
             *([bench_plots.gamma_sweep(summary, out / "gamma_sweep.png")]
               if bench_plots.swept(summary) else []),
             bench_plots.acceptance_by_position(summary, out / "acceptance_by_position.png")]
    bench_files.write_json(raw / "runs.json", records, summary, context)
    bench_files.write_csv(raw / "runs.csv", records)
    (out / "report.md").write_text(bench_markdown.render(summary, context, [p.name for p in plots]),
                                   encoding="utf-8")
    for row in summary.speedups:
        if row.category == "overall":
            print(f"{row.config}, {row.sampling}: median speedup {row.speedup.median:.2f}x "
                  f"(p10 {row.speedup.p10:.2f}, p90 {row.speedup.p90:.2f}), "
                  f"{row.fraction_slower:.0%} of prompts slower, acceptance {row.acceptance_rate:.2f}"
                  + (f", {row.forced_share:.0%} of tokens forced" if row.forced_share else ""))
    for best in summary.sweep_best:
        print(f"latency-optimal gamma for {best.drafter} {best.policy}, {best.sampling}: "
              f"{best.latency_optimal_gamma} ({best.latency_optimal_speedup:.2f}x)")
    print(f"reports in {out}, raw runs in {raw}")


def cmd_exactness(args: argparse.Namespace) -> int:
    # SciPy's statistics take over 1 s to import: only the command that tests pays for them.
    from app.reports import exactness_report
    from bench.exactness.check import ExactnessPlan, run_exactness, settings_named, total_ticks

    pair, tcfg, dcfg = _load_pair(args, [args.drafter or "hybrid"],
                                  "exactness checks the drafter it is given", args.drafter)
    draft_words = _draft_words(pair, dcfg)
    out = _out_dir(args, "exactness")
    started = time.perf_counter()
    try:
        name = args.drafter or pair.default_drafter
        drafter = pair.drafter(name)
        if drafter is None:
            raise SettingsError("exactness needs a drafter; drop --drafter plain or --draft none")
        probe = pair.make_policy(args.policy, name, args.gamma)
        # Positions a fresh policy always decodes plainly cannot show a drafting bias.
        first = args.first if args.first is not None else probe.opening_plain
        plan = ExactnessPlan(samples=_pick(args, "samples", EXACT_FULL, EXACT_QUICK),
                             gamma=args.gamma, tokens=first + args.compare, first=first,
                             alpha=args.alpha, seed=args.seed, control_tv=args.control_tv,
                             settings=settings_named(args.settings),
                             greedy_tokens=_pick(args, "greedy_tokens", EXACT_FULL, EXACT_QUICK))
        n_greedy = _pick(args, "greedy_prompts", EXACT_FULL, EXACT_QUICK)
        prompt = pair.tokens_for(args.prompt)
        greedy_prompts = [pair.tokens_for(t) for t in _greedy_texts(n_greedy)]

        def policy():
            # Each answer gets a fresh policy, as each request does.
            return pair.make_policy(args.policy, name, args.gamma)

        with tqdm(total=total_ticks(plan, len(greedy_prompts)), unit="sample", file=sys.stderr) as bar:
            def tick(label: str) -> None:
                bar.set_description_str(label, refresh=False)
                bar.update(1)
            # Batches padded as every speculative generation pads them (engine/widths.py).
            widths = pair.use_widths(name, args.gamma)
            report = run_exactness(pair.target, drafter, prompt, plan, greedy_prompts, tick=tick,
                                   policy=policy, widths=widths)
    finally:
        pair.close()
    context = {**run_context(command_line(_exactness_words(args, name, plan, n_greedy))),
               "target": tcfg.path,
               "draft": draft_words, "prompt": args.prompt, "drafter": name, "policy": args.policy,
               "wall_time": f"{time.perf_counter() - started:.0f} s"}
    written = exactness_report.write(report, context, out)
    for line in exactness_report.console_lines(report):
        print(line)
    print(f"report in {written[0]}")
    return 0 if report.passed else 1


def _greedy_texts(n: int) -> list[str]:
    """`n` suite prompts, round-robin over categories so a few still cover several kinds of text."""
    suite = load_suite(DEFAULT_SUITE)
    by_cat = [suite.select([c]).prompts for c in suite.categories]
    return [c[i].prompt for i in range(max(len(c) for c in by_cat)) for c in by_cat
            if i < len(c)][:n]


def _exactness_words(args: argparse.Namespace, name: str, plan, n_greedy: int) -> list[str]:
    """The command line that repeats this exactness run, for its report."""
    return ["exactness", "--samples", str(plan.samples), "--prompt", args.prompt,
            "--drafter", name, "--policy", args.policy, "--gamma", str(plan.gamma),
            "--first", str(plan.first), "--compare", str(args.compare), "--alpha", str(plan.alpha),
            "--seed", str(plan.seed), "--control-tv", str(plan.control_tv),
            "--settings", args.settings,
            "--greedy-prompts", str(n_greedy),
            "--greedy-tokens", str(plan.greedy_tokens)] + _model_words(args)


def register(sub: argparse._SubParsersAction) -> None:
    _register_bench(sub)
    _register_exactness(sub)


def _register_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmark speculative decoding against plain decoding")
    b.add_argument("--suite", help="prompt suite JSONL (default: assets/prompts/suite-v1.jsonl)")
    b.add_argument("--categories", nargs="+", help="categories to run (space or comma separated)")
    b.add_argument("--drafter", dest="drafters", default="draft",
                   help="comma-separated drafters: draft, lookup, suffix, hybrid, early-exit "
                   "(default draft)")
    b.add_argument("--configs", help="explicit DRAFTER[+history]:POLICY:GAMMA[:OPENING] list "
                   "instead of the drafter x policy x gamma product, e.g. "
                   "draft:fixed:3,hybrid+history:adaptive:8; OPENING sets the adaptive policy's "
                   "plain opening tokens; +history drafts from the run's earlier prompts and "
                   "answers (a history of its own, empty at the start; prompts run in file order)")
    b.add_argument("--policies", default="fixed",
                   help="comma-separated gamma policies: fixed, heuristic, adaptive (default fixed)")
    b.add_argument("--gammas", help=f"comma-separated gammas (default {BENCH_FULL['gammas']}, "
                   f"quick {BENCH_QUICK['gammas']})")
    b.add_argument("--temperatures", default="0", help="comma-separated temperatures (default 0)")
    b.add_argument("--top-p", default="1.0", help="comma-separated top-p values for temperature > 0")
    b.add_argument("--max-tokens", type=int, help=f"tokens per run (default {BENCH_FULL['max_tokens']}, "
                   f"quick {BENCH_QUICK['max_tokens']})")
    b.add_argument("--prompts-per-category", type=int,
                   help="first N prompts of each category (default all, quick 1)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--repeats", type=int, default=None,
                   help="runs of every prompt and config; speedup of the median speeds (default 1; "
                   f"{OVERHEAD_REPEATS} with --overhead)")
    b.add_argument("--lookup-ngram", type=int, default=3)
    b.add_argument("--early-exit-layers", type=int, default=None,
                   help="target layers in the early-exit drafter (default: three quarters)")
    b.add_argument("--quick", action="store_true", help="a few-minute run: 1 prompt per category, "
                   "gamma 4, 32 tokens")
    b.add_argument("--out", help="output folder (default out/bench-<date>)")
    b.add_argument("--overhead", action="store_true",
                   help="measure the engine's own time per token instead: the real generation "
                   "loop over backends that answer at once (no model is loaded); "
                   f"{OVERHEAD_TOKENS} tokens a run unless --max-tokens")
    b.add_argument("--vocab", type=int, default=QWEN_VOCAB,
                   help="vocabulary size for --overhead (default Qwen2.5's 151,936)")
    b.add_argument("--overhead-paths", help="with --overhead: comma-separated paths to run "
                   "(plain, draft, lookup, hybrid, or a label; json: the constraint's own cost, "
                   "free and under a JSON schema; default all)")
    add_draft_stop_args(b)
    add_model_args(b)
    b.set_defaults(func=cmd_bench)


def _register_exactness(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("exactness", help="check that speculative sampling matches target sampling")
    e.add_argument("--samples", type=int, help=f"samples per arm (default {EXACT_FULL['samples']}, "
                   f"quick {EXACT_QUICK['samples']})")
    e.add_argument("--prompt", default=EXACTNESS_PROMPT, help="the controlled prompt (chat template)")
    e.add_argument("--drafter", default=None,
                   help="drafter checked (default: the pair's default, as generate and the app use)")
    e.add_argument("--policy", choices=("fixed", "heuristic", "adaptive"), default=DEFAULT_POLICY,
                   help=f"gamma policy of the speculative samples (default {DEFAULT_POLICY}, "
                   "the default)")
    e.add_argument("--gamma", type=int, default=DEFAULT_GAMMA[DEFAULT_POLICY],
                   help="the adaptive controller's maximum, or the fixed gamma (default "
                   f"{DEFAULT_GAMMA[DEFAULT_POLICY]})")
    e.add_argument("--first", type=int, default=None,
                   help="first position compared (default: after the policy's forced plain opening, 0 by default)")
    e.add_argument("--compare", type=int, default=4,
                   help="positions compared from --first on (default 4)")
    e.add_argument("--settings", default="t0.7",
                   help="sampling settings, comma-separated: t1, t0.7 (with top-p 0.9), topk20, "
                   "minp0.05, or all (default t0.7)")
    e.add_argument("--control-tv", type=float, default=0.03,
                   help="the negative control's bias per verified round, in TV (default 0.03)")
    e.add_argument("--alpha", type=float, default=0.01)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--greedy-prompts", type=int, help="prompts for greedy agreement "
                   f"(default {EXACT_FULL['greedy_prompts']}, quick {EXACT_QUICK['greedy_prompts']})")
    e.add_argument("--greedy-tokens", type=int, help="tokens per greedy agreement run")
    e.add_argument("--quick", action="store_true", help=f"{EXACT_QUICK['samples']} samples per arm")
    e.add_argument("--out", help="output folder (default out/exactness-<date>)")
    add_draft_stop_args(e)
    add_model_args(e)
    e.set_defaults(func=cmd_exactness)
