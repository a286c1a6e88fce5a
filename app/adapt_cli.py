"""`tandem adapt`: train the draft toward its target on the user's own prompts (issue 45), prove
it on held-out prompts, and keep it in the store with the pairing record, which makes it the
default only where it won (bench/adapt/run.py has the run's order and rules)."""
from __future__ import annotations

import argparse
import sys
import time

from app.settings import add_model_args, model_configs
from bench.adapt import data, run, train
from bench.benchmark.suite import DEFAULT_SUITE, load_suite
from engine.backend import ModelConfig
from engine.errors import SettingsError
from loading.derived.files import derived_dir


def _progress(what: str):
    start = time.monotonic()

    def show(i: int, n: int) -> None:
        done = time.monotonic() - start
        eta = done / i * (n - i)
        print(f"\r{what}: {i}/{n}, {done:.0f} s, about {eta:.0f} s left   ", end="",
              file=sys.stderr, flush=True)
        if i == n:
            print(file=sys.stderr)
    return show


def _step(s: train.Step) -> None:
    print(f"\rtraining: step {s.done}/{s.total}, loss {s.loss:.3f}, {s.elapsed_s:.0f} s, "
          f"about {s.eta_s:.0f} s left   ", end="", file=sys.stderr, flush=True)
    if s.done == s.total:
        print(file=sys.stderr)


def _user_prompts(args: argparse.Namespace, pair, tcfg: ModelConfig) -> list[tuple[str, list[int]]]:
    """--prompts FILE's prompts, else the requests in the user's history."""
    if args.prompts:
        from app.tune_cli import tune_prompts
        return [(p.category, pair.tokens_for(p.prompt)) for p in tune_prompts(args)]
    from loading.history import HistoryStore, LOCAL
    from models.gguf_info import read_info
    state = HistoryStore.for_model(read_info(tcfg.path), 1 << 30).index(LOCAL).state()
    tokens, starts = state["tokens"], list(state["starts"]) + [len(state["tokens"])]
    docs = [tokens[s:e - 1].tolist() for s, e in zip(starts, starts[1:])]
    a, b = pair.tokens_for("alpha"), pair.tokens_for("omega beta")
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    found = data.history_prompts(docs, a[len(a) - n:])
    if len(found) < run.HOLD_OUT_EVERY * 2:
        raise SettingsError(f"the history holds {len(found)} requests; adapting needs at least "
                            f"{run.HOLD_OUT_EVERY * 2}: use it more, or give --prompts FILE")
    return [("history", t) for t in found]


def _teacher(args, tcfg: ModelConfig, threads: int, target_sha: str):
    """(trained examples, held-out examples): the target's answers, cached in the store."""
    from engine.llama.backend import quiet_backend
    from engine.pair import Pair
    with quiet_backend(ModelConfig(path=tcfg.path, n_ctx=2048, n_threads=threads,
                                   lora=tcfg.lora)) as tb:
        pair = Pair(tb)
        prompts = _user_prompts(args, pair, tcfg)
        suite = load_suite(args.holdout).select(None, args.holdout_per_category)
        others = [(p.category, pair.tokens_for(p.prompt)) for p in suite.prompts]
        mine = data.cached(data.prompts_sha256(prompts, target_sha, run.SEED, args.max_tokens),
                           derived_dir(), lambda: data.teach(
                               tb, prompts, args.max_tokens, run.SEED, _progress("teacher answers")))
        held = data.cached(data.prompts_sha256(others, target_sha, run.SEED, run.HELD_OUT_TOKENS),
                           derived_dir(), lambda: data.teach(
                               tb, others, run.HELD_OUT_TOKENS, run.SEED,
                               _progress("held-out answers")))
    trained, yours = run.split(mine, len(prompts))
    return trained, yours + held


def _default():
    """The configuration a load uses without a record, for a record adapt makes."""
    from app.runtime.defaults import DEFAULT_DRAFTER, DEFAULT_GAMMA, DEFAULT_POLICY, LOAD
    from models.candidate import Candidate
    return Candidate(DEFAULT_DRAFTER, draft_quant=LOAD.draft_quant, draft_vocab=LOAD.draft_vocab,
                     policy=DEFAULT_POLICY, gamma=DEFAULT_GAMMA[DEFAULT_POLICY])


def cmd_adapt(args: argparse.Namespace) -> int:
    from app.runtime.tuned import key_for
    from bench.adapt.build import adapt
    from engine.llama.backend import default_threads
    from models.gguf_info import read_info
    tcfg, dcfg = model_configs(args)
    if dcfg is None:
        raise SettingsError("tandem adapt trains a draft model; drop --draft none")
    if dcfg.lora:
        raise SettingsError("tandem adapt trains the draft file itself; drop --draft-lora")
    dinfo = read_info(dcfg.path)
    need = train.check_fits(dinfo, args.train, args.context, train.available_memory())
    print(f"memory plan: {need.total / train.GIB:.1f} GiB (trained tensors "
          f"{need.trained_bytes / train.GIB:.1f}, the rest of the draft "
          f"{need.frozen_bytes / train.GIB:.1f}, activations and cache "
          f"{(need.activation_bytes + need.kv_bytes) / train.GIB:.1f})")
    threads = args.threads or default_threads()
    key = key_for(tcfg.path, dcfg.path, tcfg.lora)
    trained, held = _teacher(args, tcfg, threads, key.target_sha256)
    result = adapt(tcfg, dcfg, dinfo, key, trained, held, args, threads, _step, _default())
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
                   help=f"which tensors train (default {train.DEFAULT_TRAIN}: the output head)")
    a.add_argument("--epochs", type=int, default=train.DEFAULT_EPOCHS,
                   help=f"passes over the teacher data (default {train.DEFAULT_EPOCHS})")
    a.add_argument("--context", type=int, default=train.DEFAULT_CONTEXT,
                   help=f"tokens per training window (default {train.DEFAULT_CONTEXT})")
    a.add_argument("--lr", type=float, default=train.DEFAULT_LR,
                   help=f"AdamW's learning rate (default {train.DEFAULT_LR:g})")
    a.add_argument("--max-tokens", type=int, default=data.ANSWER_TOKENS,
                   help=f"tokens per teacher answer (default {data.ANSWER_TOKENS})")
    a.set_defaults(func=cmd_adapt)

