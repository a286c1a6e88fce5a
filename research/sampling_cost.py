"""What sampling costs on the real pair, before and after an engine change, side by side in one
run: plain decoding greedy and at T 0.7 + top-p 0.9, and the draft model at fixed gamma 4
greedy and at T 0.7 + top-p 0.9, each in both trees (research/before_after.py's workers), in an order that
rotates from prompt to prompt.

  .venv/bin/python research/sampling_cost.py OLD_TREE NEW_TREE OUT.json [PER_CATEGORY] [MAX_TOKENS]

Prints per arm the median tokens/s, the median over prompts of its ratio to plain greedy
decoding of the same prompt in the same tree, and the speculative arms' acceptance (compare
before and after at their measured acceptance).
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from before_after import ask, start, suite_prompts

ARMS = (  # name, tree, drafter, temperature, top_p
    ("greedy", "old", "none", 0.0, 1.0),
    ("greedy", "new", "none", 0.0, 1.0),
    ("t0.7 top-p 0.9", "old", "none", 0.7, 0.9),
    ("t0.7 top-p 0.9", "new", "none", 0.7, 0.9),
    ("draft γ4, greedy", "old", "draft", 0.0, 1.0),
    ("draft γ4, greedy", "new", "draft", 0.0, 1.0),
    ("draft γ4, t0.7 top-p 0.9", "old", "draft", 0.7, 0.9),
    ("draft γ4, t0.7 top-p 0.9", "new", "draft", 0.7, 0.9),
)


def main(old: str, new: str, out: str, per_category: int, max_tokens: int) -> None:
    prompts = suite_prompts(per_category)
    workers = {"new": start(new), "old": start(old)}
    runs: dict[tuple[str, str], list[dict]] = {}
    for i, p in enumerate(prompts):
        for k in range(len(ARMS)):
            name, tree, drafter, temp, top_p = ARMS[(i + k) % len(ARMS)]
            got = ask(workers[tree], {"prompt": p["prompt"], "drafter": drafter, "policy": "fixed",
                                      "gamma": 4, "seed": i, "temperature": temp, "top_p": top_p,
                                      "max_tokens": max_tokens})
            runs.setdefault((name, tree), []).append(got)
        print(p["id"], flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({f"{n} [{t}]": r for (n, t), r in runs.items()}, indent=1))
    print("| arm | tree | tok/s (median) | / greedy, same tree | acceptance |")
    print("|---|---|---|---|---|")
    for (name, tree), rs in runs.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        ratio = statistics.median(r["tokens_per_s"] / g["tokens_per_s"]
                                  for r, g in zip(rs, runs[("greedy", tree)]))
        drafted = sum(r["drafted"] for r in rs)
        acc = f"{sum(r['accepted'] for r in rs) / drafted:.2f}" if drafted else "—"
        print(f"| {name} | {'before' if tree == 'old' else 'after'} | {tps:.2f} | "
              f"{ratio:.3f} | {acc} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3],
         int(sys.argv[4]) if len(sys.argv) > 4 else 1, int(sys.argv[5]) if len(sys.argv) > 5 else 64)
