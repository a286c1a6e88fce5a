"""The history workload's tables (issue 30) from one `tandem bench` run over
assets/prompts/history-v1.jsonl: every configuration's speedup over plain decoding request by
request, in the order the requests ran (so the history's warm-up shows), then median, p10 and
the share slower over all requests and after the first five; and, beside each, the cost
model's prediction on the measured GPU profile from the same rounds.

GPU profile: bench/benchmark/theory.py's `gpu_profile_speedup` on the measured curve
(bench/benchmark/gpu_profile.py, its label printed above the tables), from this run's rounds.

  .venv/bin/python -m bench.research.history_table RUNS [WARM_UP]

RUNS: a runs.json, or the `tandem bench` report folder whose raw runs are in the user's cache.
"""
from __future__ import annotations

import gzip
import json
import sys

import numpy as np

from bench.benchmark.files import runs_file
from bench.benchmark.gpu_profile import measured
from bench.benchmark.theory import gpu_profile_speedup


def _read(path: str) -> dict:
    data = runs_file(path).read_bytes()
    return json.loads(gzip.decompress(data) if path.endswith(".gz") else data)


def gpu_prediction(run: dict) -> float:
    return gpu_profile_speedup(run["output_tokens"], run["target_calls"],
                               run.get("drafted_at", []),
                               run.get("drafted_by", {}).get("draft-model", 0))


def summary(values: list[float]) -> str:
    a = np.array(values)
    if a.size == 0:
        return "—"
    return f"{np.median(a):.2f} / {np.percentile(a, 10):.2f} / {np.mean(a < 1.0):.0%}"


def main(path: str, warm_up: int = 5) -> int:
    runs = [r for r in _read(path)["runs"] if r["role"] == "speculative"]
    configs = list(dict.fromkeys(r["config"] for r in runs))
    order = list(dict.fromkeys(r["prompt_id"] for r in sorted(runs, key=lambda r: r["order"])))
    by = {(r["config"], r["prompt_id"]): r for r in runs}
    print(f"GPU profile: {measured().description}.\n")
    print("| # | request | " + " | ".join(configs) + " | history: copied / drafted "
          "from it, accepted | GPU profile (history) |")
    print("|---" * (len(configs) + 4) + "|")
    hist = next((c for c in configs if "+history" in c), None)
    for i, pid in enumerate(order, 1):
        cells = [f"{by[(c, pid)]['speedup']:.2f}" if (c, pid) in by else "—" for c in configs]
        extra = ["—", "—"]
        if hist and (hist, pid) in by:
            h = by[(hist, pid)]
            d, a = h.get("drafted_by", {}).get("suffix", 0), h.get("accepted_by", {}).get("suffix", 0)
            extra = [f"{d} / {a}", f"{gpu_prediction(h):.2f}"]
        print(f"| {i} | {pid} | " + " | ".join(cells) + " | " + " | ".join(extra) + " |")
    print()
    print("| configuration | all: median / p10 / slower | "
          f"after the first {warm_up}: median / p10 / slower | GPU profile, after "
          f"{warm_up}: median |")
    print("|---|---|---|---|")
    for c in configs:
        rows = [by[(c, pid)] for pid in order if (c, pid) in by]
        late = rows[warm_up:]
        print(f"| {c} | {summary([r['speedup'] for r in rows])} | "
              f"{summary([r['speedup'] for r in late])} | "
              f"{np.median([gpu_prediction(r) for r in late]):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
