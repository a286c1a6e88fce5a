"""A/A noise floor of `tandem bench` on this machine: every prompt decoded plainly twice, as two
interleaved "baselines", and the ratio of their decode speeds reported like a speedup.

Whatever spread this shows (median, p10, share below 0.95x) is what measurement noise alone puts
into every speedup in docs/BENCHMARKS.md. Usage:
  .venv/bin/python research/noise_floor.py [PROMPTS_PER_CATEGORY] [MAX_TOKENS]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backend import ModelConfig  # noqa: E402
from bench.benchmark.runner import _one, cold_start  # noqa: E402
from bench.benchmark.suite import load_suite  # noqa: E402
from loading.options import LoadOptions  # noqa: E402
from loading.load import load_pair  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from models.embedded import ensure  # noqa: E402


def main(argv: list[str]) -> int:
    per_cat = int(argv[0]) if argv else 3
    max_tokens = int(argv[1]) if len(argv) > 1 else 64
    target, _ = ensure()
    pair = load_pair(ModelConfig(str(target), n_ctx=4096, n_threads=2), None,
                     LoadOptions(check_budget=False))
    greedy = SamplingParams(temperature=0.0)
    prompts = load_suite().select(None, per_cat).prompts
    cold_start(pair)
    _one(pair, prompts[0], greedy, None, 8, -1)
    ratios = []
    for i, p in enumerate(prompts):
        a = _one(pair, p, greedy, None, max_tokens, 2 * i)
        b = _one(pair, p, greedy, None, max_tokens, 2 * i + 1)
        first, second = (a, b) if i % 2 == 0 else (b, a)
        ratios.append(second.tokens_per_s / first.tokens_per_s)
        print(f"{p.id:12s} {first.tokens_per_s:6.2f} {second.tokens_per_s:6.2f} tok/s  "
              f"ratio {ratios[-1]:.3f}  ({first.output_tokens} tokens)", flush=True)
    pair.close()
    r = np.array(ratios)
    print(f"A/A over {len(r)} prompts: median {np.median(r):.3f}, p10 {np.percentile(r, 10):.3f}, "
          f"p90 {np.percentile(r, 90):.3f}, below 0.95x {np.mean(r < 0.95):.0%}, "
          f"above 1.05x {np.mean(r > 1.05):.0%}")
    return 0


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    raise SystemExit(main(sys.argv[1:]))
