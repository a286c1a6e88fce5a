"""The default against the never-drafting control, repetition by repetition, in `tandem bench`
runs made with `--configs hybrid:adaptive:8,hybrid:plain:1` (docs/BENCHMARKS.md, issue 35).

Each repetition of a prompt runs plain decoding, the default and the control back to back, so the
default's decode tokens/s over the control's in the same repetition is a paired comparison. Split
by whether the default drafted in that repetition: where it drafted nothing the two decode alike
but for the default's bookkeeping, so their ratio is the A/A noise of one run plus that cost;
where it drafted, the ratio is what its drafting won or lost. Mean, median and the standard error
of the mean of each split.

  .venv/bin/python -m bench.research.control_pairs RUNS [RUNS ...]

RUNS: a runs.json, or a `tandem bench` report folder (its raw runs are in the user's cache,
bench/benchmark/files.py).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from bench.benchmark.files import runs_file

DEFAULT = "hybrid g=8 adaptive"
CONTROL = "hybrid g=1 plain"


def repetitions(runs: list[dict]) -> list[dict[str, dict]]:
    """The runs of each repetition of each prompt and sampling, by configuration ("baseline"
    for plain decoding): a repetition is one run of every configuration, in run order."""
    by_group: dict[tuple, list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["order"]):
        by_group.setdefault((r["prompt_id"], r["temperature"], r["top_p"]), []).append(r)
    width = len({r["config"] for r in runs})
    reps = []
    for group in by_group.values():
        for i in range(0, len(group) - width + 1, width):
            reps.append({r["config"]: r for r in group[i:i + width]})
    return reps


def main(args: list[str]) -> int:
    if not args:
        print(__doc__)
        return 2
    for path in args:
        runs = json.loads(runs_file(path).read_text(encoding="utf-8"))["runs"]
        split: dict[str, list[float]] = {"drafted nothing": [], "drafted": []}
        for rep in repetitions(runs):
            if DEFAULT not in rep or CONTROL not in rep:
                continue
            d, c = rep[DEFAULT], rep[CONTROL]
            key = "drafted" if d["drafted_tokens"] > 0 else "drafted nothing"
            split[key].append(d["tokens_per_s"] / c["tokens_per_s"])
        print(path)
        for key, ratios in split.items():
            x = np.array(ratios)
            if len(x) == 0:
                print(f"  {key}: no repetitions")
                continue
            print(f"  {key}: {len(x)} repetitions, default / control mean {x.mean():.3f} "
                  f"(se {x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float('nan'):.3f}), "
                  f"median {np.median(x):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
