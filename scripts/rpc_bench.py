"""The embedded target spread over two RPC workers in network namespaces, the draft local:
plain and speculative greedy decoding at 0, 2 and 10 ms round trip (tests/rpc_lab.py; run as
root with a Python whose llama-cpp-python has RPC, e.g. the venv scripts/run sets up).

One load through the delay proxies serves every delay (the proxies' delay changes between runs,
interleaved rep by rep); a second load straight to the workers measures the proxy's own cost at
0 ms. The round-trip model: a token costs its 0 ms time plus (target calls per token) x k x RTT,
where k, the network round trips one target call makes, is fitted on the plain runs (slope of
time per call over RTT) and then predicts the speculative runs.

Usage: sudo .venv/bin/python scripts/rpc_bench.py [--tokens 64] [--reps 3] [--out DIR]
Every namespace and process it starts is removed on exit, also on failure or Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backend import ModelConfig  # noqa: E402
from engine.events import DoneEvent  # noqa: E402
from engine.generator import GenerationConfig  # noqa: E402
from engine.pair import LoadOptions, Pair  # noqa: E402
from engine.policy import make_policy  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from models import embedded  # noqa: E402
from tests.rpc_lab import Lab, namespaces_allowed  # noqa: E402

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
GAMMA = 4


def run(pair: Pair, drafter: str, tokens: int) -> dict:
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=GAMMA if drafter != "none" else 0,
                              max_tokens=tokens)
    policy = make_policy("fixed", GAMMA) if drafter != "none" else None
    done = None
    for ev in pair.generate(PROMPT, config, drafter=drafter, policy=policy):
        if isinstance(ev, DoneEvent):
            done = ev
    s = done.stats
    return {"tokens": s.output_tokens, "decode_ms": s.decode_time_ms, "tps": s.tokens_per_s,
            "target_calls": s.target_calls, "calls_per_token": s.target_calls_per_token,
            "acceptance": s.acceptance_rate if drafter != "none" else None, "text": done.text}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rtts", default="0,2,10")
    ap.add_argument("--out", default="docs/results/latest/rpc")
    args = ap.parse_args()
    reason = namespaces_allowed()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    rtts = [float(r) for r in args.rtts.split(",")]
    target, draft = embedded.ensure()
    runs: list[dict] = []
    with Lab(n=2, threads=1) as lab:
        for route, endpoints in (("proxy", lab.proxied), ("direct", lab.direct)):
            t0 = time.perf_counter()
            # One thread everywhere: with more threads than free cores, ggml's OpenMP threads
            # spin waiting for preempted peers and a batched verify collapses (10x slower).
            pair = Pair.load(ModelConfig(str(target), n_ctx=1024, n_threads=1, rpc=tuple(endpoints)),
                             ModelConfig(str(draft), n_ctx=1024, n_threads=1),
                             LoadOptions())
            load_s = time.perf_counter() - t0
            try:
                run(pair, "none", 8)  # warm-up
                for rep in range(args.reps):
                    for rtt in (rtts if route == "proxy" else [0.0]):
                        lab.set_rtt_ms(rtt)
                        for drafter in ("none", "draft"):
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps(runs, indent=1))

    def med(route, rtt, drafter, key):
        return statistics.median(r[key] for r in runs
                                 if r["route"] == route and r["rtt_ms"] == rtt and r["drafter"] == drafter)

    # k: round trips per target call, from plain decoding's time per call against the RTT.
    base = med("proxy", 0.0, "none", "decode_ms") / med("proxy", 0.0, "none", "target_calls")
    top = max(rtts)
    k = ((med("proxy", top, "none", "decode_ms") / med("proxy", top, "none", "target_calls") - base)
         / top) if top else 0.0
    rows = []
    for rtt in rtts:
        plain, spec = med("proxy", rtt, "none", "tps"), med("proxy", rtt, "draft", "tps")
        model = {}
        for d in ("none", "draft"):
            ms0 = 1000.0 / med("proxy", 0.0, d, "tps")
            model[d] = 1000.0 / (ms0 + med("proxy", rtt, d, "calls_per_token") * k * rtt)
        rows.append({"rtt_ms": rtt, "plain_tps": plain, "spec_tps": spec, "speedup": spec / plain,
                     "plain_calls_per_token": med("proxy", rtt, "none", "calls_per_token"),
                     "spec_calls_per_token": med("proxy", rtt, "draft", "calls_per_token"),
                     "model_plain_tps": model["none"], "model_spec_tps": model["draft"],
                     "model_speedup": model["draft"] / model["none"]})
    direct = {d: med("direct", 0.0, d, "tps") for d in ("none", "draft")}
    summary = {"round_trips_per_call": k, "rows": rows, "direct_0ms": direct,
               "cpu": platform.processor() or platform.machine(), "gamma": GAMMA,
               "tokens": runs[0]["tokens"], "reps": max(r["rep"] for r in runs) + 1}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
