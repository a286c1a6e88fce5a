"""The cost and agreement measurements behind docs/BENCHMARKS.md's summary, on the embedded pair.

  verify            target decode time of a batch of 1..8 tokens (all rows' logits), relative to one
  widths            decode time by batch width, 1..12, of the target (logits for every row, and for
                    at most 3 rows as a padded verify of 2 drafted tokens asks) and of the derived
                    draft (last row, as a catch-up asks), and the width engine/widths.py pads to
  decode [PATH...]  one-token decode time of each GGUF (default: the draft as shipped, its
                    derived Q4_0 and pure Q8_0 copies, and the Q4_0 copy with a trimmed
                    vocabulary as the engine loads it: embeddings in, logits widened out)
  agree [PATH...]   teacher-forced greedy agreement of each draft with the target on 3 suite
                    prompts per category (64 target tokens each), by category and by the target's
                    top probability at the position

Usage: .venv/bin/python -m bench.research.measure_costs verify|widths|decode|agree [PATH...]
"""
from __future__ import annotations

import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from engine.backend import ModelConfig
from bench.benchmark.suite import load_suite
from loading.derived.quantized import derive_quantized
from engine.llama.backend import LlamaBackend
from engine.pair import Pair
from engine.confidence import top_probability
from models.embedded import ensure

TEXT = "Write a Python function that parses a CSV file and returns a list of dicts. " * 8
BUCKETS = [(0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.97), (0.97, 1.01)]


def load(path: Path) -> LlamaBackend:
    return LlamaBackend(ModelConfig(path=str(path), n_ctx=2048, n_threads=2))


def verify(target: Path) -> None:
    be = load(target)
    batch = be.tokenize(" def parse_csv(path): with open(path) as f: return list(rows(f))",
                        add_special=False)
    widths = (1, 2, 3, 4, 5, 6, 8)
    times = _by_width(be, lambda w: list(range(w)), widths, batch=batch)
    for k, ms in zip(widths, times):
        print(f"verify width {k}: {ms:6.1f} ms  {ms / times[0]:4.2f}x")


def _by_width(be: LlamaBackend, rows, widths=range(1, 13), reps: int = 7,
              batch: list[int] | None = None) -> list[float]:
    """Median ms of decoding w tokens (logits for `rows(w)`) after TEXT, for each width; the first
    repetition warms up and is dropped."""
    prompt = be.tokenize(TEXT)
    be.truncate(0)
    be.decode(prompt, 0, [len(prompt) - 1])
    n0 = len(prompt)
    filler = (batch or prompt)[:max(widths)]
    times: dict[int, list[float]] = {}
    for rep in range(reps):
        for w in widths:
            t0 = time.perf_counter()
            be.decode(filler[:w], n0, rows(w))
            dt = (time.perf_counter() - t0) * 1e3
            be.truncate(n0)
            if rep:
                times.setdefault(w, []).append(dt)
    return [statistics.median(times[w]) for w in widths]


def widths(target: Path, draft: Path) -> None:
    from engine.widths import padded_width
    tb = load(target)
    every = _by_width(tb, lambda w: list(range(w)))
    three = _by_width(tb, lambda w: list(range(min(w, 3))))
    tb.close()
    db = load(derive_quantized(draft, "q4_0"))
    last = _by_width(db, lambda w: [w - 1])
    db.close()
    print("width | target, every row | target, <= 3 rows | draft Q4_0, last row | padded to "
          "(target) | padded to (draft)")
    for w in range(1, 13):
        print(f"{w:5d} | {every[w - 1]:8.1f} | {three[w - 1]:8.1f} | {last[w - 1]:8.1f} | "
              f"{padded_width(every[:9], w):3d} | {padded_width(last[:9], w):3d}")


def decode(models: list[tuple[str, Callable[[], object]]]) -> None:
    """`models`: (name, loader) pairs; every model decodes the same token ids, all below the
    first 49,152 (which a trimmed vocabulary keeps at the same index)."""
    prompt = [int(t) for t in np.random.default_rng(0).integers(300, 40000, size=120)]
    for name, loader in models:
        be = loader()
        be.decode(prompt, 0, [len(prompt) - 1])
        ms = []
        for i in range(40):
            t0 = time.perf_counter()
            be.decode([1000 + i], len(prompt) + i, [0])
            ms.append((time.perf_counter() - t0) * 1e3)
        print(f"{name}: one-token decode {statistics.median(ms[5:]):.1f} ms")
        be.close()


def _trimmed(source: Path):
    from loading.derived.embeddings import load_trimmed
    from loading.derived.vocab_trim import derive_trimmed
    from models.gguf_info import read_info
    path = derive_trimmed(source)
    return load_trimmed(read_info(source), path, load(path))


def target_texts(target: Path) -> list[tuple[str, list[int], list[int]]]:
    tb = load(target)
    pair = Pair(tb)
    out = []
    for p in load_suite().select(None, 3).prompts:
        toks = pair.tokens_for(p.prompt)
        tb.truncate(0)
        logits = tb.decode(toks, 0, [len(toks) - 1])
        gen: list[int] = []
        for _ in range(64):
            x = int(np.argmax(logits[-1]))
            gen.append(x)
            if tb.is_eog(x):
                break
            logits = tb.decode([x], len(toks) + len(gen) - 1, [0])
        # The target's confidence at each generated position, from one batch decode.
        tb.truncate(0)
        rows = list(range(len(toks) - 1, len(toks) + len(gen) - 1))
        out.append((p.category, toks, gen, top_probability(tb.decode(toks + gen, 0, rows))))
    pair.close()
    return out


def agree(target: Path, paths: list[Path]) -> None:
    texts = target_texts(target)
    for path in paths:
        db = load(path)
        by_cat: dict[str, list[float]] = {}
        confs, hits = [], []
        for cat, toks, gen, conf in texts:
            db.truncate(0)
            rows = list(range(len(toks) - 1, len(toks) + len(gen) - 1))
            ok = np.argmax(db.decode(toks + gen, 0, rows), axis=1) == np.array(gen)
            by_cat.setdefault(cat, []).append(float(ok.mean()))
            confs += list(conf)
            hits += list(ok)
        db.close()
        c, h = np.array(confs), np.array(hits)
        overall = np.mean([v for vs in by_cat.values() for v in vs])
        print(f"{path.name}: agreement {overall:.3f} ({len(c)} positions); "
              + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in by_cat.items()))
        for lo, hi in BUCKETS:
            m = (c >= lo) & (c < hi)
            if m.any():
                print(f"  target top probability [{lo:.2f}, {min(hi, 1.0):.2f}): "
                      f"{m.sum():4d} positions, agreement {h[m].mean():.2f}")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("verify", "widths", "decode", "agree"):
        print(__doc__)
        return 2
    target, draft = ensure()
    paths = [Path(a) for a in argv[1:]]
    if argv[0] == "verify":
        verify(target)
    elif argv[0] == "widths":
        widths(target, draft)
    elif argv[0] == "decode":
        if paths:
            decode([(p.name, partial(load, p)) for p in paths])
        else:
            q4 = derive_quantized(draft, "q4_0")
            files = [draft, q4, derive_quantized(draft, "q8_0")]
            decode([(p.name, partial(load, p)) for p in files]
                   + [(f"{q4.name} with a trimmed vocabulary", partial(_trimmed, q4))])
    else:
        agree(target, paths or [draft, derive_quantized(draft, "q4_0")])
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    raise SystemExit(main(sys.argv[1:]))
