"""Issue 46's headline through a real `tandem serve` on the embedded pair: with `--parallel 4`,
4 concurrent streamed requests run together (every one's first token arrives before any ends),
each answer equals the one it gets alone (greedy: equal, or parting at a near-tie, which this
check only counts), and a short request that arrives while a long one streams ends first. The
same with `--parallel 1` (today's serial queue) is the control: there the short one waits.

  .venv/bin/python -m bench.research.serve_parallel [--parallel 4 1] [--out FILE]

Every time is seconds from the first request's send, read by the client.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.research.soak import KEY, cpu_name, start_server

PROMPTS = ["Write a Python function that reverses a string.",
           "Explain what a mutex is in two sentences.",
           "Write a SQL query that counts the rows of a table named users.",
           "Name three sorting algorithms and their complexity."]
HEADERS = {"Authorization": f"Bearer {KEY}"}


def stream(url: str, prompt: str, max_tokens: int, t0: float, first: threading.Event | None,
           out: dict) -> None:
    """One streamed chat request: the times of its first content and its end, and its text."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True}
    text, ttft = [], None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=HEADERS,
                      timeout=600) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]  # a usage chunk: none
            delta = choices[0].get("delta", {}).get("content")
            if delta:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                    if first is not None:
                        first.set()
                text.append(delta)
    out.update(ttft=ttft, end=time.perf_counter() - t0, text="".join(text))


def together(url: str, tokens: int) -> tuple[list[dict], int]:
    """The 4 requests at once (and alone after), and the most the server said were running."""
    t0 = time.perf_counter()
    outs: list[dict] = [{} for _ in PROMPTS]
    threads = [threading.Thread(target=stream, args=(url, p, tokens, t0, None, o))
               for p, o in zip(PROMPTS, outs)]
    for t in threads:
        t.start()
    running = 0
    while any(t.is_alive() for t in threads):
        queue = httpx.get(f"{url}/health", timeout=30).json()["queue"]
        running = max(running, queue["running"])
        time.sleep(0.05)
    for t in threads:
        t.join()
    for p, o in zip(PROMPTS, outs):
        alone: dict = {}
        stream(url, p, tokens, time.perf_counter(), None, alone)
        o["alone"] = alone["text"] == o["text"]
    return outs, running


def short_after_long(url: str, long: int, short: int) -> tuple[dict, float, dict]:
    t0 = time.perf_counter()
    first = threading.Event()
    a: dict = {}
    b: dict = {}
    t = threading.Thread(target=stream, args=(url, PROMPTS[0], long, t0, first, a))
    t.start()
    first.wait(600)
    arrives = time.perf_counter() - t0
    stream(url, PROMPTS[1], short, t0, None, b)
    t.join()
    return a, arrives, b


def check(parallel: int, args: argparse.Namespace) -> list[str]:
    tmp = Path(tempfile.mkdtemp(prefix="tandem-parallel-"))
    ns = argparse.Namespace(max_queue=4, ctx=2048, threads=args.threads, history_tokens=20_000,
                            parallel=parallel)
    proc, url, _ = start_server(ns, tmp)
    try:
        stream(url, "hi", 4, time.perf_counter(), None, {})  # calibrations, first decodes
        outs, running = together(url, args.tokens)
        a, arrives, b = short_after_long(url, args.long_tokens, args.short_tokens)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:  # noqa: BLE001 - a server that will not stop is killed
            proc.kill()
    ends = [o["end"] for o in outs]
    firsts = " / ".join(f"{o['ttft']:.2f}" for o in outs)
    lines = [f"| {parallel} | {firsts} | {' / '.join(f'{e:.2f}' for e in ends)} | "
             f"{'yes' if max(o['ttft'] for o in outs) < min(ends) else 'no'} | {running} | "
             f"{sum(o['alone'] for o in outs)}/{len(outs)} | "
             f"{a['end']:.2f} | {arrives:.2f} | {b['end']:.2f} | "
             f"{'yes' if b['end'] < a['end'] else 'no'} | "
             f"{sorted({o['status'] for o in outs} | {a['status'], b['status']})} |"]
    print(lines[0], flush=True)
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--parallel", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--tokens", type=int, default=48, help="each of the 4 concurrent answers")
    ap.add_argument("--long-tokens", type=int, default=160)
    ap.add_argument("--short-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    now = datetime.datetime.now(datetime.timezone.utc)
    out = [f"`tandem serve --parallel N --max-queue 4 --ctx 2048 --threads {args.threads}` on "
           f"the embedded pair, greedy chat requests, streamed; CPU: {cpu_name()}; load before "
           f"{os.getloadavg()[0]:.2f}; {now:%Y-%m-%d %H:%M} UTC. Four requests of "
           f"{args.tokens} tokens sent at once; then a {args.long_tokens}-token request and, "
           f"once its first token is out, an {args.short_tokens}-token one. Seconds from the "
           "first send.", "",
           "| --parallel | 4 at once: first tokens | 4 at once: ends | all 4 running together "
           "| most running (/health) | each equal to its answer alone | long ends | short sent | short ends | "
           "short ends first | statuses |", "|---:|---|---|---|---:|---|---:|---:|---:|---|---|"]
    print("\n".join(out), flush=True)
    for p in args.parallel:
        out += check(p, args)
    out += ["", f"Load after {os.getloadavg()[0]:.2f}."]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
