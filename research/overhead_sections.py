"""Where the default's own time goes on rounds with a copy on offer that loses: the
"losing copies" text of the overhead harness (bench/benchmark/overhead.py), plain
decoding and the default interleaved in one process, each round's engine time (thread CPU time,
the backends' own excluded) and the default's parts timed one by one.

  PYTHONPATH=TREE .venv/bin/python research/overhead_sections.py [hot|cold] [RUNS] [MODE]

The pair's clock is virtual: a target decode of w tokens costs what `tandem calibrate` measured
for the embedded 1.5B target on this 2-core Zen 5 CPU (docs/BENCHMARKS.md), a draft decode 7.4 ms
a token, so the controller decides as it would on the real pair, and alike hot and cold.
`cold`: after every decode the backend streams 64 MB, as a model's decode streams its weights,
so the engine's code and data leave the CPU's caches as they do between a real pair's decodes
(that sweep is kept out of the engine's time). The harness is loaded from this tree's file; the
engine it times comes from the tree on PYTHONPATH (a part that tree lacks is not timed).
"""
from __future__ import annotations

import functools
import importlib
import statistics
import sys
import time

import numpy as np

# research/ is the script's folder: the harness is loaded as research/overhead_tree.py loads it.
from overhead_tree import HARNESS, load, provide_modules

SWEEP = 16_000_000  # float32s: 64 MB, beyond this CPU's caches
# ms of a target decode of 1..9 tokens (`tandem calibrate --threads 2`, width 7 interpolated),
# and of a draft decode of one token.
VERIFY_MS = (25.3, 40.4, 52.4, 61.2, 75.0, 89.4, 98.4, 107.3, 115.5)
DRAFT_MS = 7.4
# The default's parts: (module, class or None, function).
PARTS = (("engine.drafters.hybrid", "HybridDrafter", "plan"),
         ("engine.drafters.prompt_lookup", "PromptLookupDrafter", "find"),
         ("engine.control.controller", "AdaptiveController", "next_gamma"),
         ("engine.control.controller", "AdaptiveController", "predict"),
         ("engine.control.controller", "AdaptiveController", "_loses"),
         ("engine.control.controller", "AdaptiveController", "_reason"),
         ("engine.control.controller", "AdaptiveController", "update"),
         ("engine.round", None, "top_probability"))


def time_parts(spent: dict[str, float]) -> None:
    """Wrap each part the tree has so its thread CPU time adds up in `spent`."""
    for module_name, owner_name, name in PARTS:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        f = getattr(owner, name, None)
        if f is None:
            continue
        label = f"{owner_name or module_name}.{name}"

        def timed(*a, _f=f, _label=label, **k):
            t0 = time.thread_time()
            try:
                return _f(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.thread_time() - t0

        setattr(owner, name, functools.wraps(f)(timed))


def main(cold: bool, runs: int, mode: str) -> None:
    provide_modules()
    h = load(HARNESS, "overhead_harness")
    from engine.events import RoundEvent
    from engine.pair import Pair
    try:
        from engine.generation_config import GenerationConfig
    except ImportError:  # trees before issue 35
        from engine.generator import GenerationConfig  # type: ignore[no-redef]

    sweep = np.ones(SWEEP, dtype=np.float32)
    clock = [0.0]  # the pair's virtual ms

    class Evicting(h.CopyRefusingBackend):
        def decode(self, tokens, pos, rows):
            out = super().decode(tokens, pos, rows)
            w = len(tokens)
            clock[0] += (VERIFY_MS[w - 1] if w <= len(VERIFY_MS)
                         else VERIFY_MS[-1] + (VERIFY_MS[-1] - VERIFY_MS[-2]) * (w - 9))
            if cold:
                t0 = time.thread_time()
                sweep.sum()
                self.decode_s += time.thread_time() - t0
            return out

    class Drafting(h.InstantBackend):
        def decode(self, tokens, pos, rows):
            clock[0] += DRAFT_MS * (1 + 0.3 * (len(tokens) - 1))
            return super().decode(tokens, pos, rows)

    n_vocab = h.QWEN_VOCAB
    letters = [1 + ord(ch) for ch in h.COPY_LETTERS]
    target = Evicting(h.llm_like_bank(n_vocab, seed=4, tops=letters), "target")
    draft = Drafting(h.llm_like_bank(n_vocab, seed=0), "draft", shift=n_vocab // 2)
    pair = Pair(target, draft, clock=lambda: clock[0])
    prompt = h.pairs_text(h.COPY_LETTERS)
    reasons: dict[str, int] = {}

    def run(drafter: str, gamma: int) -> float:
        """Engine µs per round of one answer of 256 tokens."""
        config = GenerationConfig(params=h.MODES[mode], gamma=gamma, max_tokens=256)
        policy = pair.make_policy("adaptive", drafter, gamma) if gamma else None
        target.decode_s = draft.decode_s = 0.0
        t0, n = time.thread_time(), 0
        for ev in pair.generate(prompt, config, drafter=drafter, raw=True, policy=policy):
            if isinstance(ev, RoundEvent):
                n += 1
                if gamma:
                    line = ev.round.reason.split(";")[0]
                    reasons[line[:48]] = reasons.get(line[:48], 0) + 1
        return (time.thread_time() - t0 - target.decode_s - draft.decode_s) / n * 1e6

    for _ in range(2):  # calibration, warm caches, and the evidence that copies lose
        run("hybrid", 8), run("plain", 0)
    spent: dict[str, float] = {}
    time_parts(spent)
    reasons.clear()
    default, plain = [], []
    for _ in range(runs):
        default.append(run("hybrid", 8))
        plain.append(run("plain", 0))
    d, p = statistics.median(default), statistics.median(plain)
    rounds = 256 * runs
    print(f"{'cold' if cold else 'hot'}, {mode}, {runs} runs of 256 tokens: plain {p:.1f} µs a "
          f"round, default {d:.1f} (parts timed), extra {d - p:.1f}")
    for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {label:36s} {s / rounds * 1e6:7.1f} µs a round")
    print("  reasons:", ", ".join(f"{k}… {v}" for k, v in sorted(reasons.items(),
                                                              key=lambda kv: -kv[1])[:4]))


if __name__ == "__main__":
    main(len(sys.argv) > 1 and sys.argv[1] == "cold",
         int(sys.argv[2]) if len(sys.argv) > 2 else 8,
         sys.argv[3] if len(sys.argv) > 3 else "greedy")
