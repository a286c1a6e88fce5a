"""Trace-driven simulation of gamma policies on the embedded pair (greedy), the evidence behind the
adaptive controller's proposal trimming and the drafter's chain stop.

  record OUT.json [PER_CATEGORY] [MAX_TOKENS] [--draft-vocab trim]
      Decode suite prompts plainly on the target (its greedy tokens and its top probability at
      each), run the draft (as loaded by default: its Q4_0 copy) teacher-forced over the same
      text (its greedy token and untempered top probability at each position), and time target
      verify widths 1..9 and draft batch widths: everything a greedy round depends on.
  redraft TRACE.json OUT.json
      Keep a trace's target side and measure the draft's columns and costs again (with
      `--draft-vocab trim`, the draft with a trimmed output vocabulary: scripts/benchmarks'
      what-if for loading/derived/vocab_trim.py).
  replay TRACE.json
      Replay the engine's own policies over the trace, with round costs from the timings (or
      with `--verify-ratios r1,r2,...` to try another verify curve, relative to one token): a
      greedy round's accepted prefix is fully determined by the trace, so each policy's rounds,
      and their simulated time against plain decoding, are computed without noise. Prints the
      per-category median speedup, p10 and share below 0.95x for each configuration.

Usage: .venv/bin/python scripts/policy_sim.py record /tmp/trace.json 8 64
       .venv/bin/python scripts/policy_sim.py replay /tmp/trace.json
       .venv/bin/python scripts/policy_sim.py replay /tmp/trace.json --verify-ratios 1,1.33,1.62,1.43,1.78,2.05,2.2,2.44,2.6
"""
from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backend import ModelConfig  # noqa: E402
from engine.controller import AdaptiveController  # noqa: E402
from engine.policy import FixedGamma, GammaPolicy  # noqa: E402
from engine.stats import RoundStats  # noqa: E402
from engine.widths import padded_width  # noqa: E402

DRAFT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _timed(backend, prefix: list[int], filler: list[int], widths, all_rows: bool) -> list[float]:
    backend.truncate(0)
    backend.decode(prefix, 0, [len(prefix) - 1])
    n0 = len(prefix)
    times: dict[int, list[float]] = {}
    for _ in range(5):
        for w in widths:
            batch = (filler * (w // len(filler) + 1))[:w]
            t0 = time.perf_counter()
            backend.decode(batch, n0, list(range(w)) if all_rows else [w - 1])
            times.setdefault(w, []).append((time.perf_counter() - t0) * 1e3)
            backend.truncate(n0)
    return [statistics.median(times[w]) for w in widths]


def _draft_backend(draft: Path, vocab: str):
    """The draft as the engine loads it by default (its Q4_0 copy), its vocabulary trimmed when
    `vocab` is "trim"."""
    from loading.derived.quantized import derive_quantized
    from engine.llama_backend import LlamaBackend
    source = derive_quantized(draft, "q4_0")
    if vocab == "full":
        return LlamaBackend(ModelConfig(path=str(source), n_ctx=4096, n_threads=2))
    from loading.derived.embeddings import load_trimmed
    from loading.derived.vocab_trim import derive_trimmed
    trimmed = derive_trimmed(source)
    inner = LlamaBackend(ModelConfig(path=str(trimmed), n_ctx=4096, n_threads=2))
    return load_trimmed(source, trimmed, inner)


def _draft_columns(recs: list[dict], vocab: str) -> dict:
    """Teacher-force the draft over each record's text: its greedy token and untempered top
    probability at every position, and its batch costs."""
    from engine.sampling import top_probability
    from models.embedded import ensure
    db = _draft_backend(ensure()[1], vocab)
    for r in recs:
        db.truncate(0)
        rows = list(range(len(r["toks"]) - 1, len(r["toks"]) + len(r["gen"])))
        lg = db.decode(r["toks"] + r["gen"], 0, rows)
        r["dargmax"] = [int(a) for a in np.argmax(lg, axis=1)]
        r["dconf"] = [float(c) for c in top_probability(lg)]
    draft_ms = _timed(db, recs[0]["toks"], recs[0]["gen"], DRAFT_WIDTHS, all_rows=False)
    db.close()
    return dict(zip(DRAFT_WIDTHS, draft_ms))


def record(out: Path, per_category: int, max_tokens: int, vocab: str = "full") -> None:
    from engine.benchmark.suite import load_suite
    from engine.llama_backend import LlamaBackend
    from engine.pair import Pair
    from engine.sampling import top_probability
    from models.embedded import ensure

    target, _ = ensure()
    tb = LlamaBackend(ModelConfig(path=str(target), n_ctx=4096, n_threads=2))
    pair = Pair(tb)
    recs = []
    for p in load_suite().select(None, per_category).prompts:
        toks = pair.tokens_for(p.prompt)
        tb.truncate(0)
        logits = tb.decode(toks, 0, [len(toks) - 1])
        gen: list[int] = []
        conf: list[float] = []
        for _ in range(max_tokens):
            x = int(np.argmax(logits[-1]))
            conf.append(float(top_probability(logits[-1:])[0]))
            if tb.is_eog(x):
                break
            gen.append(x)
            logits = tb.decode([x], len(toks) + len(gen) - 1, [0])
        recs.append({"id": p.id, "cat": p.category, "toks": toks, "gen": gen, "tconf": conf})
        print(f"{p.id}: {len(gen)} tokens", file=sys.stderr, flush=True)
    verify = _timed(tb, recs[0]["toks"], recs[0]["gen"], range(1, 10), all_rows=True)
    pair.close()
    _write(out, recs, verify, _draft_columns(recs, vocab))


def redraft(trace: Path, out: Path, vocab: str) -> None:
    """The trace's target side kept, the draft's columns and costs measured again."""
    data = json.loads(trace.read_text())
    _write(out, data["recs"], data["verify_ms"], _draft_columns(data["recs"], vocab))


def _write(out: Path, recs: list[dict], verify: list[float], draft_ms: dict) -> None:
    out.write_text(json.dumps({"recs": recs, "verify_ms": verify, "draft_ms": draft_ms}))
    print(f"verify ms {[round(v, 1) for v in verify]}; draft batch ms "
          f"{[round(d, 1) for d in draft_ms.values()]} at widths {DRAFT_WIDTHS}")


class Costs:
    def __init__(self, verify_ms: list[float], draft_ms: dict) -> None:
        self.verify_ms = verify_ms
        self.widths = sorted(int(k) for k in draft_ms)
        self.draft = [float(draft_ms[str(k)] if str(k) in draft_ms else draft_ms[k])
                      for k in self.widths]
        # The draft's cost at the widths the verify table covers: what the engine's calibration
        # measures, and what its padding reads.
        self.draft_table = [self.draft_batch(w) for w in range(1, len(verify_ms) + 1)]

    def padded_verify(self, w: int, pad: bool = True) -> tuple[int, float]:
        """The width a verify of w tokens is decoded at (engine/widths.py), and its cost."""
        width = padded_width(self.verify_ms, w) if pad else w
        return width, self.verify(width)

    def padded_draft(self, w: int, pad: bool = True) -> float:
        """The cost of a draft decode of w tokens (a catch-up), padded as the engine pads it."""
        return self.draft_batch(padded_width(self.draft_table, w) if pad else w)

    def verify(self, w: int) -> float:
        v = self.verify_ms
        return v[w - 1] if w <= len(v) else v[-1] + (v[-1] - v[-2]) * (w - len(v))

    def draft_batch(self, w: int) -> float:
        if w <= self.widths[-1]:
            return float(np.interp(w, self.widths, self.draft))
        return self.draft[-1] * w / self.widths[-1]


def replay_one(rec: dict, policy: GammaPolicy, costs: Costs, chain_min: float,
               max_tokens: int = 64, pad: bool = True) -> float:
    """Simulated speedup of one prompt: plain decode time over the policy's rounds' time. Rounds
    follow the engine: the draft stops after the token that takes its chain under chain_min,
    the policy's `keep_drafting` stops it before a token, the accepted prefix is where the draft's greedy token
    first differs from the target's, and batches are padded to cheaper widths (`pad`)."""
    gen, dam, dconf, tconf = rec["gen"], rec["dargmax"], rec["dconf"], rec["tconf"]
    n = len(gen)
    i, lag, total, index = 0, 1, 0.0, 0
    while i <= n and i < max_tokens:
        room = min(max_tokens - i - 1, n - i)
        g = min(policy.next_gamma(), max(room, 0))
        draft_ms, own = 0.0, []
        if g > 0:
            # As the draft model drafts: a greedy row's `sure` is the draft's top probability
            # at that position, checked before the token is taken; a decode per further row.
            draft_ms = costs.padded_draft(lag, pad)
            while policy.keep_drafting(own, dconf[i + len(own)], g, False):
                own.append(dconf[i + len(own)])
                if len(own) == g or float(np.prod(own)) < chain_min:
                    break
                draft_ms += costs.draft_batch(1)
        kept = len(own)
        acc = 0
        while acc < kept and dam[i + acc] == gen[i + acc]:
            acc += 1
        width, verify_ms = costs.padded_verify(kept + 1, pad and kept > 0)
        committed = min(acc + 1, n + 1 - i)
        lag = (2 if acc == len(own) else 1) if g > 0 else lag + 1
        policy.update(RoundStats(index=index, gamma=g, drafted=kept, accepted=acc, kind="",
                                 committed=committed, draft_ms=draft_ms, verify_ms=verify_ms,
                                 source="draft-model" if g else "none",
                                 confidence=tuple(tconf[i:i + acc + 1]), width=width))
        total += draft_ms + verify_ms
        i += committed
        index += 1
    return costs.verify(1) * min(n + 1, max_tokens) / total


def replay(trace: Path, verify_ratios: list[float] | None = None) -> None:
    data = json.loads(trace.read_text())
    verify = data["verify_ms"]
    if verify_ratios:
        verify = [verify[0] * r for r in verify_ratios]
    costs = Costs(verify, data["draft_ms"])

    def adaptive(trim: bool, opening: int = 3, pad: bool = True,
                 **kw) -> Callable[[], GammaPolicy]:
        def make() -> GammaPolicy:
            c = AdaptiveController(max_gamma=8, verify_ms=list(costs.verify_ms),
                                   draft_ms=list(costs.draft_table),
                                   model_source="draft-model", opening_plain=opening, **kw)
            if not pad:
                c.pad_verify, c.pad_draft = [], []
            return c if trim else _NoTrim(c)
        return make

    configs = [("fixed 3, full gamma", lambda: FixedGamma(3), 0.0, True),
               ("fixed 3, chain stop 0.5, no padding", lambda: FixedGamma(3), 0.5, False),
               ("fixed 3, chain stop 0.5", lambda: FixedGamma(3), 0.5, True),
               ("adaptive 8, 1 plain opening round, no stop, no trim (midday)",
                adaptive(False, 1), 0.0, True),
               ("adaptive 8, 1 plain opening round, chain stop 0.5, trim", adaptive(True, 1), 0.5,
                True),
               ("adaptive 8, chain stop 0.5, no trim", adaptive(False), 0.5, True),
               ("adaptive 8, chain stop 0.3, trim", adaptive(True), 0.3, True),
               ("adaptive 8, chain stop 0.5, trim, no padding", adaptive(True, pad=False), 0.5,
                False),
               ("adaptive 8, chain stop 0.5, trim, catch-up over a fixed 4 rounds",
                adaptive(True, horizon_cap=0.0), 0.5, True),
               ("adaptive 8, chain stop 0.5, trim (default)", adaptive(True), 0.5, True),
               ("adaptive 8, chain stop 0.7, trim", adaptive(True), 0.7, True)]
    for opening in (2, 4, 6, 10, 16):
        configs.append((f"adaptive 8, {opening} plain opening rounds, chain stop 0.5, trim",
                        adaptive(True, opening), 0.5, True))
    cats = sorted({r["cat"] for r in data["recs"]})
    print(f"{len(data['recs'])} prompts; verify ms {[round(v) for v in costs.verify_ms]}")
    conf = np.array([c for r in data["recs"] for c in r["dconf"][:len(r["gen"])]])
    agree = np.array([a == g for r in data["recs"] for a, g in zip(r["dargmax"], r["gen"])])
    print(f"greedy agreement {agree.mean():.3f} over {len(agree)} positions; by the draft's "
          "untempered probability of its token:")
    for lo, hi in ((0, .3), (.3, .5), (.5, .7), (.7, .8), (.8, .9), (.9, .98), (.98, 1.01)):
        m = (conf >= lo) & (conf < hi)
        print(f"  [{lo:.2f}, {min(hi, 1.0):.2f}): {m.mean():4.0%} of positions, agreement "
              f"{agree[m].mean():.2f}")
    print("| config | " + " | ".join(cats) + " | median | p10 | below 0.95x |")
    print("|---" * (len(cats) + 4) + "|")
    def row(name: str, speed: dict) -> None:
        s = np.array(list(speed.values()))
        per_cat = [np.median([speed[r["id"]] for r in data["recs"] if r["cat"] == c]) for c in cats]
        print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in per_cat)
              + f" | {np.median(s):.2f} | {np.percentile(s, 10):.2f} | {np.mean(s < 0.95):.0%} |")

    for name, make, chain_min, pad in configs:
        row(name, {r["id"]: replay_one(r, make(), costs, chain_min, pad=pad) for r in data["recs"]})
    row("oracle: knows which drafted tokens the target keeps (the ceiling)",
        {r["id"]: oracle_one(r, costs) for r in data["recs"]})


def oracle_one(rec: dict, costs: Costs, max_tokens: int = 64, max_gamma: int = 8) -> float:
    """The fastest schedule of rounds any policy could pick with this draft and these costs,
    knowing in advance how many drafted tokens the target will keep (dynamic programming over
    position and the draft's lag): each round drafts no more than will be accepted, so no draft
    token and no verify row is wasted. An upper bound, not a policy."""
    gen, dam = rec["gen"], rec["dargmax"]
    n = len(gen)
    run = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        run[i] = run[i + 1] + 1 if dam[i] == gen[i] else 0
    end = min(n + 1, max_tokens)

    @functools.lru_cache(maxsize=None)
    def best(i: int, lag: int) -> float:
        if i >= end:
            return 0.0
        fastest = costs.verify(1) + best(i + 1, lag + 1)
        for k in range(1, min(run[i], end - 1 - i, max_gamma) + 1):
            draft = costs.padded_draft(lag) + (k - 1) * costs.draft_batch(1)
            fastest = min(fastest, draft + costs.padded_verify(k + 1)[1] + best(i + k + 1, 2))
        return fastest

    return costs.verify(1) * end / best(0, 1)


class _NoTrim(GammaPolicy):
    """The adaptive controller without its stopping rule (`keep_drafting`), for comparison."""

    def __init__(self, inner: AdaptiveController) -> None:
        self.inner = inner

    def next_gamma(self, source: str = "") -> int:
        return self.inner.next_gamma(source)

    def update(self, r: RoundStats) -> None:
        self.inner.update(r)


def main(argv: list[str]) -> int:
    vocab = "full"
    if "--draft-vocab" in argv:
        i = argv.index("--draft-vocab")
        vocab = argv[i + 1] if i + 1 < len(argv) else ""
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 2 or argv[0] not in ("record", "redraft", "replay") or vocab not in ("full", "trim"):
        print(__doc__)
        return 2
    if argv[0] == "record":
        record(Path(argv[1]), int(argv[2]) if len(argv) > 2 else 8,
               int(argv[3]) if len(argv) > 3 else 64, vocab)
    elif argv[0] == "redraft":
        if len(argv) < 3:
            print(__doc__)
            return 2
        redraft(Path(argv[1]), Path(argv[2]), vocab)
    else:
        ratios = None
        if len(argv) > 3 and argv[2] == "--verify-ratios":
            ratios = [float(x) for x in argv[3].split(",")]
        replay(Path(argv[1]), ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
