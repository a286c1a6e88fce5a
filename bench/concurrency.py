"""Concurrent clients on the embedded pair: aggregate tokens/s, per-request latency p50/p99 and
time to first token, batched in slots (engine/slots.py) against the serial queue (one at a time,
each request's latency counting its wait).

    PYTHONPATH=. python -m bench.concurrency --clients 1 2 4 8 --max-tokens 48 --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

from engine.backend import ModelConfig
from engine.control.registry import make_policy
from engine.events import DoneEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.llama.backend import LlamaBackend
from engine.llama.quiet import quiet_llama
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.slots import sequences_for
from models import embedded

PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\n\n# ",
           "SELECT name FROM users WHERE", "Once upon a time, a small robot", "<html>\n  <head>\n",
           "fn main() {\n    let", "The three laws of motion are"]


def load(parallel: int, threads: int, n_ctx: int) -> Pair:
    quiet_llama()
    target, draft = (LlamaBackend(ModelConfig(str(m.path), n_ctx=n_ctx, n_threads=threads,
                                              n_seq=sequences_for(parallel)))
                     for m in (embedded.TARGET, embedded.DRAFT))
    return Pair(target, draft, parallel=parallel)


def one(pair: Pair, prompt: str, config: GenerationConfig, drafter: str, t0: float,
        lock: threading.Lock | None, out: list) -> None:
    """A client: its request from t0 (waiting for `lock`, the serial queue, when given)."""
    if lock is not None:
        lock.acquire()
    try:
        first = None
        policy = None if drafter == "plain" else make_policy("fixed", config.gamma)
        for ev in pair.generate(prompt, config, drafter=drafter, raw=True, policy=policy):
            if isinstance(ev, TokenEvent) and first is None:
                first = time.perf_counter() - t0
            if isinstance(ev, DoneEvent):
                out.append((time.perf_counter() - t0, first, len(ev.tokens)))
    finally:
        if lock is not None:
            lock.release()


def run(pair: Pair, clients: int, config: GenerationConfig, drafter: str, serial: bool) -> dict:
    out: list = []
    lock = threading.Lock() if serial else None
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(pair, PROMPTS[i % len(PROMPTS)], config,
                                                  drafter, t0, lock, out))
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in out)
    ttft = sorted(r[1] for r in out)
    return {"clients": clients, "mode": "serial" if serial else "batched", "drafter": drafter,
            "tok_s": sum(r[2] for r in out) / wall, "p50_s": statistics.median(lat),
            "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "ttft_p50_s": statistics.median(ttft)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", nargs="+", default=["draft", "plain"])
    args = ap.parse_args()
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=3,
                              max_tokens=args.max_tokens)
    widest = max(args.clients)
    batched, serial = load(widest, args.threads, 1024), load(1, args.threads, 1024)
    try:
        print("clients mode    drafter  tok/s   p50 s   p99 s   TTFT p50 s")
        for drafter in args.drafter:
            for pair in (serial, batched):
                # Warm: calibration and the first decodes are not the figures.
                run(pair, 1, config, drafter, pair is serial)
            for k in args.clients:
                for pair in (serial, batched):
                    r = run(pair, k, config, drafter, pair is serial)
                    print(f"{r['clients']:7d} {r['mode']:7s} {drafter:8s} {r['tok_s']:6.1f} "
                          f"{r['p50_s']:7.2f} {r['p99_s']:7.2f} {r['ttft_p50_s']:9.2f}", flush=True)
    finally:
        batched.close()
        serial.close()


if __name__ == "__main__":
    main()
