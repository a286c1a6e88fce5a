"""The default path's speed in two versions of the engine, side by side in one run.

  .venv/bin/python research/before_after.py OLD_TREE NEW_TREE OUT.json [PER_CATEGORY]
      [MAX_TOKENS] [DRAFTER:POLICY:GAMMA] [TEMPERATURE]

Starts one worker process per tree (each imports the engine from its tree and loads the
embedded pair as `tandem generate` does), then for every suite prompt runs plain decoding and
both versions' speculative path (default: the default path, hybrid:adaptive:8), one at a time,
in an order that rotates from prompt to prompt, at temperature 0.7 (or the one given) with a
fixed seed per prompt. Prints per category and overall the median speedup over plain, p10 and the share of
prompts below 0.95x for each version, and writes every run's stats to OUT.json.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "suite-v1.jsonl"


def worker() -> None:
    from engine.backend import ModelConfig
    from engine.events import DoneEvent
    from engine.sampling import SamplingParams
    from models import embedded
    # engine/generation_config.py since issue 35, engine/generator.py before it.
    try:
        from engine.generation_config import GenerationConfig
    except ImportError:
        from engine.generator import GenerationConfig  # type: ignore[no-redef]
    # Imported here, from the tree on PYTHONPATH: loading/load.py since issue 27,
    # loading/pair.py before it, and Pair.load before the loading layer.
    try:
        from loading.options import LoadOptions
        try:
            from loading.load import load_pair
        except ImportError:
            from loading.pair import load_pair
    except ImportError:
        from engine.pair import LoadOptions, Pair
        load_pair = Pair.load

    target, draft = embedded.ensure()
    pair = load_pair(ModelConfig(str(target), n_ctx=4096, n_threads=2),
                     ModelConfig(str(draft), n_ctx=4096, n_threads=2), LoadOptions())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        config = GenerationConfig(params=SamplingParams(temperature=job["temperature"],
                                                        top_p=job.get("top_p", 1.0),
                                                        seed=job["seed"]),
                                  gamma=job["gamma"], max_tokens=job["max_tokens"])
        policy = (pair.make_policy(job["policy"], job["drafter"], job["gamma"])
                  if job["drafter"] != "plain" else None)
        done = [ev for ev in pair.generate(job["prompt"], config, drafter=job["drafter"],
                                           policy=policy) if isinstance(ev, DoneEvent)][0]
        s = done.stats
        print(json.dumps({"tokens_per_s": s.tokens_per_s, "output_tokens": s.output_tokens,
                          "decode_ms": s.decode_time_ms, "total_ms": s.total_time_ms,
                          "ttft_ms": s.ttft_ms, "drafted": s.drafted_tokens,
                          "accepted": s.accepted_tokens, "target_calls": s.target_calls}),
              flush=True)


def start(tree: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.Popen([sys.executable, __file__, "worker"], cwd=tree, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["ready"]
    return proc


def ask(proc: subprocess.Popen, job: dict) -> dict:
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def suite_prompts(per_category: int) -> list[dict]:
    """The first `per_category` prompts of each category of the suite."""
    lines = [json.loads(x) for x in SUITE.read_text().splitlines()[1:] if x.strip()]
    seen: dict[str, int] = {}
    prompts = []
    for p in lines:
        if seen.get(p["category"], 0) < per_category:
            seen[p["category"]] = seen.get(p["category"], 0) + 1
            prompts.append(p)
    return prompts


def summary(ratios: list[float]) -> str:
    r = sorted(ratios)
    p10 = r[max(0, int(round(0.1 * (len(r) - 1))))]
    slow = sum(x < 0.95 for x in r) / len(r)
    return f"median {statistics.median(r):.3f}  p10 {p10:.3f}  below 0.95x {slow:.0%}"


def main(old: str, new: str, out: str, per_category: int, max_tokens: int, spec: str,
         temperature: float = 0.7) -> None:
    drafter, policy, gamma = spec.split(":")
    prompts = suite_prompts(per_category)
    workers = {"new": start(new), "old": start(old)}
    arms = [("plain", "new", "plain"), ("before", "old", drafter), ("after", "new", drafter)]
    records = []
    for i, p in enumerate(prompts):
        row = {"id": p["id"], "category": p["category"]}
        for k in range(len(arms)):
            name, tree, arm_drafter = arms[(i + k) % len(arms)]
            row[name] = ask(workers[tree], {"prompt": p["prompt"], "drafter": arm_drafter,
                                            "policy": policy, "gamma": int(gamma),
                                            "seed": i, "temperature": temperature,
                                            "max_tokens": max_tokens})
        records.append(row)
        print(p["id"], {a: round(row[a]["tokens_per_s"], 2) for a, _, _ in arms}, flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(records, indent=1))
    for version in ("before", "after"):
        print(f"== {version}")
        for cat in dict.fromkeys(r["category"] for r in records):
            ratios = [r[version]["tokens_per_s"] / r["plain"]["tokens_per_s"]
                      for r in records if r["category"] == cat]
            print(f"  {cat:16s} {summary(ratios)}")
        print(f"  {'all':16s} " + summary([r[version]["tokens_per_s"] / r["plain"]["tokens_per_s"]
                                          for r in records]))
        acc = sum(r[version]["accepted"] for r in records) / max(1, sum(r[version]["drafted"]
                                                                         for r in records))
        print(f"  acceptance {acc:.2f}, plain {statistics.median(r['plain']['tokens_per_s'] for r in records):.2f} tok/s median")


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker()
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3],
             int(sys.argv[4]) if len(sys.argv) > 4 else 3, int(sys.argv[5]) if len(sys.argv) > 5 else 96,
             sys.argv[6] if len(sys.argv) > 6 else "hybrid:adaptive:8",
             float(sys.argv[7]) if len(sys.argv) > 7 else 0.7)
