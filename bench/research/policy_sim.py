"""Trace-driven simulation of gamma policies on the embedded pair (greedy): the evidence behind
the adaptive controller's choices and the drafter's chain stop (docs/design/controller.md).

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
      Replay the engine's own generation over the trace: a target and a draft that answer as
      the trace recorded (`TraceFake`), whose decodes cost the recorded timings on a virtual
      clock (or `--verify-ratios r1,r2,...`, another verify curve relative to one token), run
      through the real `Pair.generate` with each policy. A greedy round's outcome is fully
      determined by the trace, so each policy's time against plain decoding is computed without
      noise, by the very code that runs. Prints the per-category median speedup, p10 and share
      below 0.95x for each configuration, and the oracle's ceiling.
  suite TRACE.json [REPEATS] [--verify-ratios ...] [--gpu [PROFILE.json]]
      The default (hybrid, adaptive) as `tandem bench --repeats REPEATS` runs it: every prompt
      REPEATS times in a row, the pair's evidence kept across answers; per category, the
      median, p10 and share below 0.98x, without measurement noise; then every fixed gamma of
      the draft model and of hybrid, and the default against the best of them. `--gpu`: the
      measured GPU profile's verify and draft times (bench/benchmark/gpu_profile.py: the H200
      run's, or PROFILE.json), in its own milliseconds, instead of the trace's measured costs;
      the output opens with its label.

Usage: .venv/bin/python -m bench.research.policy_sim record /tmp/trace.json 8 64
       .venv/bin/python -m bench.research.policy_sim replay /tmp/trace.json
       .venv/bin/python -m bench.research.policy_sim replay /tmp/trace.json --verify-ratios 1,1.33,1.62,1.43,1.78,2.05,2.2,2.44,2.6
       .venv/bin/python -m bench.research.policy_sim suite /tmp/trace.json 3
"""
from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from bench.fakes.table import VirtualClock
from engine.backend import ModelConfig
from engine.control.controller import AdaptiveController
from engine.control.evidence import Evidence
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.control.policy import FixedGamma, GammaPolicy
from engine.sampling import SamplingParams
from bench.benchmark.gpu_profile import GpuProfile, load as load_profile
from engine.widths import padded_width

DRAFT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# The widths a GPU profile's costs are tabled at for a replay (the longest copy's verify).
GPU_WIDTHS = 65


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
    from engine.llama.backend import LlamaBackend
    source = derive_quantized(draft, "q4_0")
    if vocab == "full":
        return LlamaBackend(ModelConfig(path=str(source), n_ctx=4096, n_threads=2))
    from loading.derived.embeddings import load_trimmed
    from loading.derived.vocab_trim import derive_trimmed
    from models.gguf_info import read_info
    trimmed = derive_trimmed(source)
    inner = LlamaBackend(ModelConfig(path=str(trimmed), n_ctx=4096, n_threads=2))
    return load_trimmed(read_info(source), trimmed, inner)


def _draft_columns(recs: list[dict], vocab: str) -> dict:
    """Teacher-force the draft over each record's text: its greedy token and untempered top
    probability at every position, and its batch costs."""
    from engine.confidence import top_probability
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


def greedy_answer(tb, toks: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
    """The target's greedy answer to `toks` (up to `max_tokens`, its end-of-generation token
    left out) and its top probability at each position, the end's included."""
    from engine.confidence import top_probability
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
    return gen, conf


def record(out: Path, per_category: int, max_tokens: int, vocab: str = "full") -> None:
    from bench.benchmark.suite import load_suite
    from engine.llama.backend import LlamaBackend
    from engine.pair import Pair
    from models.embedded import ensure

    target, _ = ensure()
    tb = LlamaBackend(ModelConfig(path=str(target), n_ctx=4096, n_threads=2))
    pair = Pair(tb)
    recs = []
    for p in load_suite().select(None, per_category).prompts:
        toks = pair.tokens_for(p.prompt)
        gen, conf = greedy_answer(tb, toks, max_tokens)
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

    def padded_verify(self, w: int) -> float:
        """The cost of a verify of w tokens at the width the engine pads it to."""
        return self.verify(padded_width(self.verify_ms, w))

    def padded_draft(self, w: int) -> float:
        """The cost of a draft decode of w tokens (a catch-up), padded as the engine pads it."""
        return self.draft_batch(padded_width(self.draft_table, w))

    def verify(self, w: int) -> float:
        v = self.verify_ms
        return v[w - 1] if w <= len(v) else v[-1] + (v[-1] - v[-2]) * (w - len(v))

    def draft_batch(self, w: int) -> float:
        if w <= self.widths[-1]:
            return float(np.interp(w, self.widths, self.draft))
        return self.draft[-1] * w / self.widths[-1]


class TraceFake:
    """The target (`draft` False) or the draft of one trace record, as a Backend: at each
    position of the recorded answer its greedy token is the one recorded (the target's answer,
    then its end-of-generation token; the draft's own greedy token), with the recorded top
    probability; a decode of w tokens costs `cost(w)` virtual ms. Token ids are renumbered into
    a small vocabulary; a prompt is written as its ids ("17 203 5")."""

    def __init__(self, rec: dict, ids: dict[int, int], clock: VirtualClock,
                 cost: Callable[[int], float], draft: bool = False, n_ctx: int = 4096) -> None:
        self.rec, self.ids, self.clock, self.cost, self.draft = rec, ids, clock, cost, draft
        self.name = "trace-draft" if draft else "trace-target"
        self.n_vocab = len(ids) + 1
        self.eog = len(ids)
        self.n_ctx = n_ctx
        self.n_batch = 512
        self.cache: list[int] = []
        self.prompt_len = len(rec["toks"])

    def _row(self, n: int) -> np.ndarray:
        """The logits for the token at absolute position n."""
        k = n - self.prompt_len
        gen = self.rec["gen"]
        if self.draft:
            k = min(max(k, 0), len(self.rec["dargmax"]) - 1)
            top, p = self.ids[self.rec["dargmax"][k]], self.rec["dconf"][k]
        else:
            k = min(max(k, 0), len(gen))
            top = self.ids[gen[k]] if k < len(gen) else self.eog
            p = self.rec["tconf"][min(k, len(self.rec["tconf"]) - 1)]
        p = min(max(p, 1e-6), 1 - 1e-6)
        row = np.zeros(self.n_vocab, dtype=np.float32)
        row[top] = np.log(p * (self.n_vocab - 1) / (1 - p))
        return row

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        assert pos == len(self.cache), "positions out of step"
        self.clock.ms += self.cost(len(tokens))
        self.cache.extend(int(t) for t in tokens)
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.stack([self._row(pos + r + 1) for r in rows])

    def truncate(self, n: int) -> None:
        del self.cache[n:]

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        words = text.split()
        if words and all(w.isdigit() for w in words):
            return [int(w) for w in words]
        return [1 + b % (self.n_vocab - 2) for b in text.encode()]

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == self.eog else f"{token} ".encode()

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    def chat_prompt(self, messages) -> str:
        return " ".join(m["content"] for m in messages)

    def close(self) -> None:
        self.cache.clear()


def replay_one(rec: dict, make_policy: Callable[[], GammaPolicy | None], costs: Costs,
               chain_min: float, drafter: str = "draft", max_tokens: int = 64,
               evidence: Callable[[str], Evidence] | None = None) -> float:
    """Simulated speedup of one prompt: plain decoding's time over the policy's, both through
    `Pair.generate` over the trace, less the target's prefill (the same for both, and not what a
    policy changes); the draft's prefill counts wherever it is paid. `evidence`: where the
    pair's drafters find what earlier answers taught (as a process's pair does); a fresh pair
    knows nothing without it."""
    ids = {t: i for i, t in enumerate(dict.fromkeys(rec["toks"] + rec["gen"] + rec["dargmax"]))}
    prompt = " ".join(str(ids[t]) for t in rec["toks"])

    def run(policy_drafter: str, policy: GammaPolicy | None) -> tuple[float, float,
                                                                      tuple[int, ...]]:
        clock = VirtualClock()
        pair = Pair(TraceFake(rec, ids, clock, costs.verify),
                    TraceFake(rec, ids, clock, costs.draft_batch, draft=True),
                    chain_min=chain_min, clock=clock.now)
        if evidence is not None:
            pair.knowledge.restore_evidence_from(evidence)
        config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8,
                                  max_tokens=max_tokens)
        done = [ev for ev in pair.generate(prompt, config, drafter=policy_drafter, raw=True,
                                           policy=policy) if isinstance(ev, DoneEvent)][0]
        return done.stats.total_time_ms, done.stats.prefill_ms, done.tokens

    plain, prefill, want = run("plain", None)
    spent, _, got = run(drafter, make_policy())
    assert got == want, "a replayed policy changed the greedy answer"
    return (plain - prefill) / (spent - prefill)


def replay(trace: Path, verify_ratios: list[float] | None = None) -> None:
    data = json.loads(trace.read_text())
    verify = data["verify_ms"]
    if verify_ratios:
        verify = [verify[0] * r for r in verify_ratios]
    costs = Costs(verify, data["draft_ms"])

    def adaptive(trim: bool, **kw) -> Callable[[], GammaPolicy | None]:
        # Uncalibrated: Pair.generate calibrates it on the trace's costs.
        return lambda: (AdaptiveController if trim else _NoTrim)(max_gamma=8, **kw)

    configs = [("fixed 3, full gamma", lambda: FixedGamma(3), 0.0, "draft"),
               ("fixed 3, chain stop 0.5", lambda: FixedGamma(3), 0.5, "draft"),
               ("adaptive 8, chain stop 0.5, no trim", adaptive(False), 0.5, "draft"),
               ("adaptive 8, chain stop 0.3, trim", adaptive(True), 0.3, "draft"),
               ("adaptive 8, chain stop 0.5, trim, catch-up over a fixed 4 rounds",
                adaptive(True, horizon_cap=0.0), 0.5, "draft"),
               ("adaptive 8, chain stop 0.5, no hope", adaptive(True, hope=0.0), 0.5, "draft"),
               ("adaptive 8, chain stop 0.5, opening not capped", adaptive(True, opening=()),
                0.5, "draft"),
               ("adaptive 8, chain stop 0.5, trim (default drafter model)", lambda: None, 0.5,
                "draft"),
               ("adaptive 8, chain stop 0.7, trim", lambda: None, 0.7, "draft"),
               ("hybrid adaptive 8 (the default)", lambda: None, 0.5, "hybrid")]
    for opening in (3, 6):
        configs.append((f"adaptive 8, {opening} forced plain opening rounds",
                        adaptive(True, opening_plain=opening), 0.5, "draft"))
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

    for name, make, chain_min, drafter in configs:
        row(name, {r["id"]: replay_one(r, make, costs, chain_min, drafter)
                   for r in data["recs"]})
    row("oracle: knows which drafted tokens the target keeps (the ceiling)",
        {r["id"]: oracle_one(r, costs) for r in data["recs"]})


def suite_speeds(recs: list[dict], costs: Costs, repeats: int) -> dict[str, list[float]]:
    """Every record's replayed speedups of the default (hybrid, adaptive), `repeats` runs in a
    row per record, in order, through pairs that share one store of evidence: what
    `tandem bench --repeats N` does in one process, without its noise."""
    kept: dict[str, Evidence] = {}

    def evidence(name: str) -> Evidence:
        return kept.setdefault(name, Evidence())

    return {r["id"]: [replay_one(r, lambda: None, costs, 0.5, "hybrid", evidence=evidence)
                      for _ in range(repeats)] for r in recs}


def gpu_costs(profile: GpuProfile) -> Costs:
    """A measured GPU profile's costs in its own ms: the target's verify and the draft's decodes
    at widths 1..GPU_WIDTHS, read as the profile reads them (measured, interpolated, extended)."""
    return Costs(list(profile.verify_table(GPU_WIDTHS)),
                 dict(zip(range(1, GPU_WIDTHS + 1), profile.draft_table(GPU_WIDTHS))))


def replay_suite(trace: Path, repeats: int, verify_ratios: list[float] | None = None,
                 gpu: GpuProfile | None = None) -> None:
    """Per category, the default's median over prompts of its median over repeats
    (`suite_speeds`), as `tandem bench` reports the speedup of the medians; the never-drafting
    control is 1 here by construction. Then every fixed gamma of the draft model and of hybrid
    (chain stop 0.5, a fresh pair per answer: a fixed gamma learns nothing), for the default's
    distance to the best of them. `gpu`: the replay on that measured profile's costs."""
    data = json.loads(trace.read_text())
    verify = data["verify_ms"]
    if verify_ratios:
        verify = [verify[0] * r for r in verify_ratios]
    costs = gpu_costs(gpu) if gpu is not None else Costs(verify, data["draft_ms"])
    if gpu is not None:
        print(f"GPU profile: {gpu.description}.\n")
    recs = data["recs"]
    runs = suite_speeds(recs, costs, repeats)
    for rid, xs in runs.items():
        print(f"{rid}: " + " ".join(f"{x:.3f}" for x in xs), file=sys.stderr)
    speed = {rid: float(np.median(xs)) for rid, xs in runs.items()}
    cats = list(dict.fromkeys(r["cat"] for r in recs))
    print(f"{len(recs)} prompts x {repeats} repeats, evidence kept across answers; verify ms "
          f"{[round(v, 1) for v in costs.verify_ms[:9]]} at widths 1-9, draft ms "
          f"{costs.draft_batch(1):.1f} a decode")
    print("| configuration | " + " | ".join(cats) + " | **all** | p10 | below 0.98x | geomean |")
    print("|---" * (len(cats) + 5) + "|")

    def row(name: str, sp: dict[str, float]) -> tuple[float, float]:
        per_cat = [np.median([sp[r["id"]] for r in recs if r["cat"] == c]) for c in cats]
        s = np.array(list(sp.values()))
        geo = float(np.exp(np.log(s).mean()))
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in per_cat)
              + f" | {np.median(s):.3f} | {np.percentile(s, 10):.3f} | {np.mean(s < 0.98):.0%} "
              f"| {geo:.3f} |")
        return float(np.median(s)), geo

    default = row("default (hybrid, adaptive ≤ 8)", speed)
    # The best fixed configuration by the median and by the geometric mean (plain: 1, 1).
    best = [(1.0, "plain"), (1.0, "plain")]
    for drafter in ("draft", "hybrid"):
        for g in range(1, 9):
            sp = {r["id"]: replay_one(r, lambda: FixedGamma(g), costs, 0.5, drafter) for r in recs}
            stats = row(f"{drafter}, fixed γ {g}", sp)
            best = [max(b, (x, f"{drafter} γ {g}")) for b, x in zip(best, stats)]
    for what, (value, name), mine in zip(("median", "geometric mean"), best, default):
        print(f"\nbest fixed by the {what}: {name} at {value:.3f}; the default at "
              f"{mine / value:.3f} of it")


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
            fastest = min(fastest, draft + costs.padded_verify(k + 1) + best(i + k + 1, 2))
        return fastest

    return costs.verify(1) * end / best(0, 1)


def _gpu_profile(argv: list[str]) -> GpuProfile | None:
    """`--gpu [PROFILE.json]`: that measured profile (default: the H200 run's); None without it."""
    if "--gpu" not in argv:
        return None
    i = argv.index("--gpu")
    given = argv[i + 1] if i + 1 < len(argv) and argv[i + 1].endswith(".json") else None
    return load_profile(given)


class _NoTrim(AdaptiveController):
    """The adaptive controller without its stopping rule (`keep_drafting`), for comparison."""

    def keep_drafting(self, own, sure, limit, fixed_width) -> bool:
        return True


def main(argv: list[str]) -> int:
    vocab = "full"
    if "--draft-vocab" in argv:
        i = argv.index("--draft-vocab")
        vocab = argv[i + 1] if i + 1 < len(argv) else ""
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 2 or argv[0] not in ("record", "redraft", "replay", "suite") or vocab not in ("full", "trim"):
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
        if "--verify-ratios" in argv:
            ratios = [float(x) for x in argv[argv.index("--verify-ratios") + 1].split(",")]
        if argv[0] == "suite":
            replay_suite(Path(argv[1]), int(argv[2]) if len(argv) > 2 and argv[2].isdigit()
                         else 3, ratios, gpu=_gpu_profile(argv))
        else:
            replay(Path(argv[1]), ratios)
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    raise SystemExit(main(sys.argv[1:]))
