"""The embedded target spread over two RPC workers in network namespaces, the draft local:
plain and speculative greedy decoding at 0, 2 and 10 ms round trip (bench/rpc_lab.py; run as
root with a Python whose llama-cpp-python has RPC, e.g. the venv scripts/run sets up).

One load through the delay proxies serves every delay (the proxies' delay changes between runs,
interleaved rep by rep); a second load straight to the workers measures the proxy's own cost at
0 ms. The round-trip model: a token costs its direct (0 ms) time plus (target calls per token)
x L, where L, the network cost of one target call, is read off plain decoding at each setting
(its ms/token minus direct plain's) and then predicts speculative decoding; L's slope over the
RTT is the number of network round trips per target call.

Usage: sudo .venv/bin/python -m bench.rpc_bench [--tokens 64] [--reps 3] [--rtts 0,2,10]
       [--out DIR]; `--table` rewrites summary.json (and prints the table) from the raw runs.
The raw runs (runs.json) go to the user's cache (bench/benchmark/files.py runs_dir(DIR)),
summary.json to DIR.
Every namespace and process it starts is removed on exit, also on failure or Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.benchmark.files import runs_dir
from engine.backend import ModelConfig
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.control.registry import make_policy
from engine.sampling import SamplingParams
from loading.options import LoadOptions
from loading.load import load_pair
from models import embedded
from bench.rpc_lab import Lab, namespaces_allowed

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
GAMMA = 4


def run(pair: Pair, drafter: str, tokens: int) -> dict:
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=GAMMA if drafter != "plain" else 0,
                              max_tokens=tokens)
    policy = make_policy("fixed", GAMMA) if drafter != "plain" else None
    done = None
    for ev in pair.generate(PROMPT, config, drafter=drafter, policy=policy):
        if isinstance(ev, DoneEvent):
            done = ev
    s = done.stats
    return {"tokens": s.output_tokens, "decode_ms": s.decode_time_ms, "tps": s.tokens_per_s,
            "target_calls": s.target_calls, "calls_per_token": s.target_calls_per_token,
            "acceptance": s.acceptance_rate if drafter != "plain" else None, "text": done.text}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtts", default="0,2,10")
    ap.add_argument("--out", default="docs/results/latest/rpc")
    ap.add_argument("--table", action="store_true", help="only rewrite summary.json from runs.json")
    args = ap.parse_args()
    rtts = [float(r) for r in args.rtts.split(",")]
    if args.table:
        write(Path(args.out), json.loads((runs_dir(Path(args.out)) / "runs.json").read_text()),
              rtts)
        return 0
    reason = namespaces_allowed()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    target, draft = embedded.ensure()
    runs: list[dict] = []
    with Lab(n=2, threads=1) as lab:
        for route, endpoints in (("proxy", lab.proxied), ("direct", lab.direct)):
            t0 = time.perf_counter()
            # One thread everywhere: with more threads than free cores, ggml's OpenMP threads
            # spin waiting for preempted peers and a batched verify collapses (10x slower).
            pair = load_pair(ModelConfig(str(target), n_ctx=1024, n_threads=1, rpc=tuple(endpoints)),
                             ModelConfig(str(draft), n_ctx=1024, n_threads=1),
                             LoadOptions())
            load_s = time.perf_counter() - t0
            try:
                run(pair, "plain", 8)  # warm-up
                for rep in range(args.reps):
                    for rtt in (rtts if route == "proxy" else [0.0]):
                        lab.set_rtt_ms(rtt)
                        for drafter in ("plain", "draft"):
                            r = run(pair, drafter, args.tokens)
                            r.update(route=route, rtt_ms=rtt, drafter=drafter, rep=rep,
                                     load_s=load_s, load=os.getloadavg()[0])
                            runs.append(r)
                            print(f"{route} rtt {rtt:4.1f} ms {drafter:5} {r['tps']:6.2f} tok/s "
                                  f"{r['calls_per_token']:.2f} calls/token", flush=True)
            finally:
                pair.close()
    write(Path(args.out), runs, rtts)
    return 0


def write(out: Path, runs: list[dict], rtts: list[float]) -> None:
    """runs.json (in the user's cache), and summary.json with the table: per route and RTT, L
    (the network cost per target call: plain ms/token minus direct plain's), tok/s, speedup,
    and the model's speculative tok/s = 1000 / (direct speculative ms/token + calls per token
    x L)."""
    out.mkdir(parents=True, exist_ok=True)
    (runs_dir(out) / "runs.json").write_text(json.dumps(runs, indent=1))

    def med(route, rtt, drafter, key):
        return statistics.median(r[key] for r in runs
                                 if r["route"] == route and r["rtt_ms"] == rtt and r["drafter"] == drafter)

    plain0, spec0 = (1000.0 / med("direct", 0.0, d, "tps") for d in ("plain", "draft"))
    cpt = med("direct", 0.0, "draft", "calls_per_token")
    rows = []
    for route, rtt in [("direct", 0.0)] + [("proxy", r) for r in rtts]:
        plain, spec = med(route, rtt, "plain", "tps"), med(route, rtt, "draft", "tps")
        net = 1000.0 / plain - plain0
        model = 1000.0 / (spec0 + cpt * net)
        rows.append({"route": route, "rtt_ms": rtt, "net_ms_per_call": net, "plain_tps": plain,
                     "spec_tps": spec, "speedup": spec / plain, "model_spec_tps": model,
                     "model_speedup": model / plain})
    proxied = [r for r in rows if r["route"] == "proxy"]
    lo, hi = proxied[0], proxied[-1]
    summary = {"round_trips_per_call": (hi["net_ms_per_call"] - lo["net_ms_per_call"])
               / (hi["rtt_ms"] - lo["rtt_ms"]) if hi["rtt_ms"] > lo["rtt_ms"] else None,
               "direct_ms_per_token": {"plain": plain0, "speculative": spec0},
               "spec_calls_per_token": cpt, "breakeven_net_ms_per_call": (spec0 - plain0) / (1 - cpt),
               "rows": rows, "gamma": GAMMA, "tokens": runs[0]["tokens"],
               "reps": max(r["rep"] for r in runs) + 1,
               "load": [min(r["load"] for r in runs), max(r["load"] for r in runs)]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    for r in rows:
        print(f"| {r['route']}, {r['rtt_ms']:g} ms | {r['net_ms_per_call']:.1f} | {r['plain_tps']:.2f} | "
              f"{r['spec_tps']:.2f} | {r['speedup']:.2f}x | {r['model_spec_tps']:.2f} | "
              f"{r['model_speedup']:.2f}x |")


if __name__ == "__main__":
    from engine.llama.quiet import quiet_llama
    quiet_llama()
    sys.exit(main())
