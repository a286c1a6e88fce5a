"""Per-category tables of `tandem bench` runs for the controller's comparison (issue 17): for each
configuration the median speedup over the interleaved plain run, p10 and the share below 0.95x,
and the default's median against the better of plain and the best fixed gamma.

  .venv/bin/python -m bench.research.bench_tables RUNS [RUNS ...] [--default CONFIG]

RUNS: a runs.json, or a `tandem bench` report folder (its raw runs are in the user's cache,
bench/benchmark/files.py).

The default is the first adaptive configuration unless --default names one; the reference is
the better of plain decoding and the best fixed gamma.
"""
from __future__ import annotations

import gzip
import json
import sys

import numpy as np

from bench.benchmark.files import runs_file


def _read(path: str) -> bytes:
    """A bench's runs.json (a report folder: the runs it names in the user's cache), or a
    gzipped copy."""
    data = runs_file(path).read_bytes()
    return gzip.decompress(data) if path.endswith(".gz") else data


POLICY_WORDS = (" adaptive", " plain", " heuristic")


def main(args: list[str]) -> int:
    default_label = None
    if "--default" in args:
        i = args.index("--default")
        default_label, args = args[i + 1], args[:i] + args[i + 2:]
    runs = [r for p in args for r in json.loads(_read(p))["runs"]
            if r["role"] == "speculative"]
    configs = sorted({r["config"] for r in runs}, key=lambda c: ("adaptive" in c, c))
    cats = sorted({r["category"] for r in runs})
    default = default_label or next(c for c in configs if "adaptive" in c)
    # The reference: fixed gammas only (a control or another adaptive run is not one).
    fixed = [c for c in configs if not any(w in c for w in POLICY_WORDS)]

    def speeds(config: str, cat: str | None = None) -> np.ndarray:
        return np.array([r["speedup"] for r in runs
                         if r["config"] == config and (cat is None or r["category"] == cat)])

    print("| category | n | " + " | ".join(configs) + " | default / better of plain, best fixed |")
    print("|---" * (len(configs) + 3) + "|")
    for cat in [*cats, None]:
        cells = []
        for c in configs:
            s = speeds(c, cat)
            cells.append(f"{np.median(s):.2f} / {np.percentile(s, 10):.2f} / {np.mean(s < 0.95):.0%}")
        best = max([1.0] + [float(np.median(speeds(c, cat))) for c in fixed])
        ratio = float(np.median(speeds(default, cat))) / best
        print(f"| {cat or 'all'} | {len(speeds(default, cat))} | " + " | ".join(cells)
              + f" | {ratio:.2f} |")
    d = speeds(default)
    print(f"\ndefault ({default}): p10 over all prompts {np.percentile(d, 10):.2f}; "
          f"drafted tokens per answer by category: "
          + ", ".join(f"{cat} {np.mean([r['drafted_tokens'] for r in runs if r['config'] == default and r['category'] == cat]):.1f}"
                      for cat in cats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
