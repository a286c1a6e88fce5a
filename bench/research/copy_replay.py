"""Trace-driven replay of long copies on whole-file edits (issue 62): the default (hybrid),
prompt lookup and the prediction priced on a measured verify curve to 65, without the noise of a
busy machine.

  record OUT.json [--suite FILE] [--max-tokens 256] [--limit N]
      Decode each prompt of the suite (default: the whole-file edits) plainly on the embedded
      target (greedy: its tokens and its top probability at each), run the draft teacher-forced
      over the same text (bench/research/policy_sim.py's draft columns), and keep the prompt's
      fenced file as the prediction a client would send (bench/llama_server_peer.py's).
  replay TRACE.json [--calibration FILE] [--evidence FILE] [--configs NAME,...] [--rounds]
      Replay the engine's own generation over the trace (policy_sim's `TraceFake` through the
      real `Pair.generate`), its decodes costing the calibration's verify and draft curves
      (a file kept under calibrations/ in the model store, loading/calibrations.py; default:
      the one kept for the embedded pair, the newest) on a virtual clock. Per configuration,
      every prompt's speedup over plain decoding (the target's prefill left out of both), their
      median and p10, acceptance and drafted tokens; with --rounds, each round of each answer.
      Prompts run in order through one pair, so evidence carries from answer to answer as it
      does in `tandem bench` and `tandem serve` (one fresh store of evidence per configuration,
      or, with --evidence, the drafters' evidence kept in that file, as `tandem serve` starts).

Usage: .venv/bin/python -m bench.research.copy_replay record /tmp/edits.json
       .venv/bin/python -m bench.research.copy_replay replay /tmp/edits.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bench.fakes.table import VirtualClock
from bench.research.policy_sim import Costs, TraceFake, _draft_columns, greedy_answer
from engine.control.costs import dense
from engine.control.evidence import Evidence
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams

FILE_EDITS = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "file-edits-v1.jsonl"
# The widest verify a replay prices: a 64-token copy and the last committed token.
WIDEST = 65


def record(out: Path, suite_path: Path, max_tokens: int, limit: int | None,
           threads: int) -> None:
    from bench.benchmark.suite import load_suite
    from bench.llama_server_peer import prediction_of
    from engine.backend import ModelConfig
    from engine.llama.backend import LlamaBackend
    from models.embedded import ensure

    target, _ = ensure()
    tb = LlamaBackend(ModelConfig(path=str(target), n_ctx=4096, n_threads=threads))
    pair = Pair(tb)
    recs = []
    for p in list(load_suite(suite_path).prompts)[:limit]:
        toks = pair.tokens_for(p.prompt)
        gen, conf = greedy_answer(tb, toks, max_tokens)
        pred = pair.prediction_tokens(prediction_of(p))
        recs.append({"id": p.id, "cat": p.category, "toks": toks, "gen": gen, "tconf": conf,
                     "pred": pred})
        print(f"{p.id}: {len(gen)} tokens", file=sys.stderr, flush=True)
    pair.close()
    draft_ms = _draft_columns(recs, "full")
    out.write_text(json.dumps({"recs": recs, "draft_ms": draft_ms}))


def kept_calibration(path: Path | None) -> tuple[dict[int, float], dict[int, float]]:
    """(verify, draft) costs in ms by width from a kept calibration file (its hybrid drafter's:
    the target's curve and the draft model's), the newest in the model store when no `path`."""
    if path is None:
        from models.tandem_store import store_path
        kept = sorted((store_path() / "calibrations").glob("*.json"),
                      key=lambda p: p.stat().st_mtime)
        if not kept:
            raise SystemExit("error: no kept calibration; run `tandem calibrate` or pass "
                             "--calibration FILE")
        path = kept[-1]
    d = json.loads(path.read_text())["drafters"]
    hybrid = d.get("hybrid") or next(iter(d.values()))
    return ({int(w): float(ms) for w, ms in hybrid["verify"]},
            {int(w): float(ms) for w, ms in hybrid.get("draft") or [[1, 0.0]]})


def costs_of(verify: dict[int, float], draft: dict[int, float]) -> Costs:
    return Costs(dense(verify, WIDEST), {str(w): ms for w, ms in draft.items()})


@dataclass
class Answer:
    """One replayed answer: its speedup over plain decoding and what its rounds did."""
    speedup: float
    drafted: int
    accepted: int
    rounds: list[tuple[int, int, int, str, str]]


def replay_answer(rec: dict, costs: Costs, drafter: str, prediction: bool,
                  evidence: Callable[[str], Evidence] | None, max_tokens: int = 256) -> Answer:
    """The speedup of one answer by `drafter` (with the record's prediction when asked) over
    plain decoding, both through `Pair.generate` over the trace, less the target's prefill; the
    rounds as (drafted, accepted, committed, source, reason)."""
    ids = {t: i for i, t in enumerate(dict.fromkeys(rec["toks"] + rec["gen"] + rec["dargmax"]
                                                    + rec.get("pred", [])))}
    prompt = " ".join(str(ids[t]) for t in rec["toks"])
    pred = [ids[t] for t in rec.get("pred", [])] if prediction else []

    def run(name: str, ev: Callable[[str], Evidence] | None):
        clock = VirtualClock()
        pair = Pair(TraceFake(rec, ids, clock, costs.verify),
                    TraceFake(rec, ids, clock, costs.draft_batch, draft=True),
                    chain_min=0.5, clock=clock.now)
        if ev is not None:
            pair.knowledge.restore_evidence_from(ev)
        config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8,
                                  max_tokens=max_tokens)
        rounds, done = [], None
        for e in pair.generate(prompt, config, drafter=name, raw=True, prediction=pred):
            if isinstance(e, RoundEvent):
                s = e.round
                rounds.append((s.drafted, s.accepted, s.committed, s.source, s.reason))
            elif isinstance(e, DoneEvent):
                done = e
        assert done is not None
        return done, rounds

    plain, _ = run("plain", None)
    spent, rounds = run(drafter, evidence)
    assert spent.tokens == plain.tokens, "a replayed policy changed the greedy answer"
    p, s = plain.stats, spent.stats
    return Answer((p.total_time_ms - p.prefill_ms) / (s.total_time_ms - s.prefill_ms),
                  s.drafted_tokens, s.accepted_tokens, rounds)


CONFIGS = {"default": ("hybrid", False), "lookup": ("lookup", False),
           "prediction": ("hybrid", True)}


def replay_suite(recs: Sequence[dict], costs: Costs, drafter: str, prediction: bool,
                 max_tokens: int = 256, start: dict | None = None) -> dict[str, Answer]:
    """Every record in order through one store of evidence (as a process's pair keeps it),
    starting from `start`'s (a kept evidence file's `drafters`, as `tandem serve` starts from
    it) when given, else from nothing (as `tandem bench`)."""
    kept: dict[str, Evidence] = {}

    def evidence(name: str) -> Evidence:
        if name not in kept:
            kept[name] = (Evidence.restore(start[name]) if start and name in start
                          else Evidence())
        return kept[name]

    return {r["id"]: replay_answer(r, costs, drafter, prediction, evidence, max_tokens)
            for r in recs}


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--suite", type=Path, default=FILE_EDITS)
    rec.add_argument("--max-tokens", type=int, default=256)
    rec.add_argument("--limit", type=int, default=None)
    rec.add_argument("--threads", type=int, default=2)
    rep = sub.add_parser("replay")
    rep.add_argument("trace", type=Path)
    rep.add_argument("--calibration", type=Path, default=None)
    rep.add_argument("--configs", default=",".join(CONFIGS))
    rep.add_argument("--max-tokens", type=int, default=256)
    rep.add_argument("--rounds", action="store_true")
    rep.add_argument("--evidence", type=Path, default=None,
                     help="start from a kept evidence file (evidence/ in the model store)")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        record(args.out, args.suite, args.max_tokens, args.limit, args.threads)
        return 0
    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration {unknown[0]!r}; known: {', '.join(CONFIGS)}")
    verify, draft = kept_calibration(args.calibration)
    costs = costs_of(verify, draft)
    recs = json.loads(args.trace.read_text())["recs"]
    start = (json.loads(args.evidence.read_text())["drafters"] if args.evidence is not None
             else None)
    one = verify[1]
    print(f"{len(recs)} prompts; verify at widths {sorted(verify)}: "
          + " ".join(f"{verify[w] / one:.2f}" for w in sorted(verify)) + " target tokens")
    print("| config | " + " | ".join(r["id"] for r in recs) + " | median | p10 | accepted |")
    print("|---" * (len(recs) + 4) + "|")
    for name in args.configs.split(","):
        drafter, prediction = CONFIGS[name]
        got = replay_suite(recs, costs, drafter, prediction, args.max_tokens, start)
        s = [a.speedup for a in got.values()]
        acc = sum(a.accepted for a in got.values()) / max(sum(a.drafted for a in got.values()), 1)
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in s)
              + f" | {statistics.median(s):.3f} | {np.percentile(s, 10):.2f} | {acc:.2f} |",
              flush=True)
        if args.rounds:
            for rid, a in got.items():
                print(f"## {name} {rid}: {a.speedup:.3f}", file=sys.stderr)
                for r in a.rounds:
                    print("  ", *r, file=sys.stderr, sep="\t")
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    raise SystemExit(main(sys.argv[1:]))
