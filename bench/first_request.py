"""The first request of a new `tandem serve` process against its later ones (issue 62's "on a
machine that has calibrated once, the first request of a new serve process runs as fast as its
later ones"): fresh `tandem serve --no-history` processes, one after the other, each sent the
whole-file edits one request at a time, greedy, with no warm-up.

  .venv/bin/python -m bench.first_request [--processes 3] [--requests 4] [--max-tokens 128]
      [--threads 2] [--ctx 4096] [--parallel N] [--prompts FILE] [--out DIR]

`scripts/benchmarks first-request` runs it.

Before the processes are timed, one priming process answers one short request, so the machine
has calibrated once: it starts from the calibration kept for the pair, machine and settings
(loading/calibrations.py) or measures and keeps one. Each process then says where its first
request's calibration came from: the calibrations folder unchanged and no busy line in its log
is the kept one; a new file there is one it measured and kept; its "used but not kept" line is
one measured on a busy machine (the figures are then not this benchmark's claim, and the report
says so). Evidence the controller kept (loading/evidence.py) is restored by every process, as in
use; the history of past requests is off.

Order: process p sends the first N prompts (N requests a process) rotated by p (p, p + 1, ...
mod N), so each process opens with another prompt and every prompt sent first is also sent later
by the other processes: request 1 is compared with the same prompt's later requests, never with
another prompt. Figures per
request: decode tokens/s (`speculative.tokens_per_s`: completion tokens over decode_ms, from the
end of the prefill to the last committed token), and the request's wall time as the client saw
it (the prefill, and any calibration, included).

Report: per prompt opened with, request 1's rate over the median of its later requests; the
median of those ratios against the spread of the later requests themselves (each later rate
over its prompt's later median, min to max): request 1 runs as fast as the later ones when its
ratio lies within that spread.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from bench.benchmark.suite import SuitePrompt, load_suite
from bench.llama_server_peer import (DEFAULT_PROMPTS, TANDEM, Config, Outcome, Server, ask,
                                     cpu_line)
from bench.research.soak import free_port
from models.embedded import DRAFT, TARGET

DEFAULT = Config("tandem default", TANDEM)
# The priming request: short, on a prompt none of the measured ones is.
PRIME = SuitePrompt("prime", "prime", "Fix the typo. Reply with the complete file only.\n\n"
                    "```python\ndef add(a, b):\n    retrun a + b\n```")
PRIME_TOKENS = 8
# What a serve process prints when its calibration was taken on a busy machine (loading/calibrations.py).
NOT_KEPT = "this calibration is used but not kept"
KEPT_BEFORE, MEASURED_KEPT, MEASURED_BUSY = "kept before", "measured and kept", "measured, busy, not kept"


@dataclass(frozen=True)
class Request:
    """One measured request: the process it went to (0-based), its place there (1-based), the
    server's figures, and the wall time the client waited."""
    process: int
    position: int
    outcome: Outcome
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.outcome.refused and self.outcome.tps > 0


@dataclass(frozen=True)
class Process:
    """A process's requests, and where its calibration came from."""
    index: int
    calibration: str
    requests: tuple[Request, ...]


class Served(Protocol):
    url: str

    def stop(self) -> None: ...


def rotations(prompt_ids: Sequence[str], processes: int, requests: int) -> list[list[str]]:
    """The prompts each process sends, in order: the first `requests` prompts, rotated by the
    process's index, so every prompt one process opens with the others send later.

    >>> rotations(["a", "b", "c", "d", "e"], 3, 4)
    [['a', 'b', 'c', 'd'], ['b', 'c', 'd', 'a'], ['c', 'd', 'a', 'b']]
    """
    if requests > len(prompt_ids):
        raise ValueError(f"{requests} requests a process need as many prompts, got "
                         f"{len(prompt_ids)}")
    return [[prompt_ids[(p + i) % requests] for i in range(requests)] for p in range(processes)]


def snapshot(folder: Path) -> dict[str, int]:
    """The calibrations folder's files and their modification times (ns)."""
    try:
        return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.suffix == ".json"}
    except OSError:
        return {}


def calibration_source(before: dict[str, int], after: dict[str, int], log: str) -> str:
    """Where a process's calibration came from: the busy line in its log, a file it wrote in the
    calibrations folder, or neither (the kept one).

    >>> calibration_source({"a.json": 1}, {"a.json": 1}, "")
    'kept before'
    >>> calibration_source({}, {"a.json": 2}, ""), calibration_source({}, {}, NOT_KEPT)
    ('measured and kept', 'measured, busy, not kept')
    """
    if NOT_KEPT in log:
        return MEASURED_BUSY
    return MEASURED_KEPT if after != before else KEPT_BEFORE


def run(orders: Sequence[Sequence[str]], prompts: dict[str, SuitePrompt],
        start: Callable[[], tuple[Served, Callable[[], str]]], max_tokens: int,
        calibrations: Path, asker: Callable[..., Outcome] = ask,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[Request], None] = lambda r: None) -> Iterator[Process]:
    """Prime one process with a short request, then for each order a fresh process: its
    requests one at a time, then stopped. `start()` gives a running server and a reader of its
    log so far."""
    server, _ = start()
    try:
        asker(server.url, PRIME, DEFAULT, PRIME_TOKENS, -1)
    finally:
        server.stop()
    for p, order in enumerate(orders):
        before = snapshot(calibrations)
        server, log = start()
        done = []
        try:
            for i, pid in enumerate(order):
                t0 = clock()
                outcome = asker(server.url, prompts[pid], DEFAULT, max_tokens, p)
                done.append(Request(p, i + 1, outcome, clock() - t0))
                progress(done[-1])
        finally:
            server.stop()
        yield Process(p, calibration_source(before, snapshot(calibrations), log()), tuple(done))


@dataclass(frozen=True)
class Summary:
    """Request 1 against the later requests: per process, the prompt it opened with and request
    1's rate over the median of that prompt's later rates (in any process), and their median;
    and the later requests' own spread, each over its prompt's later median."""
    first_over_later: list[tuple[int, str, float]]
    median: float | None
    spread: tuple[float, float] | None
    first_tps: list[float]
    later_tps: list[float]
    first_wall_s: list[float]
    later_wall_s: list[float]


def summarise(processes: Sequence[Process]) -> Summary:
    requests = [r for p in processes for r in p.requests if r.ok]
    later: dict[str, list[float]] = {}
    for r in requests:
        if r.position > 1:
            later.setdefault(r.outcome.prompt, []).append(r.outcome.tps)
    medians = {k: statistics.median(v) for k, v in later.items()}
    ratios = [(r.process, r.outcome.prompt, round(r.outcome.tps / medians[r.outcome.prompt], 4))
              for r in requests if r.position == 1 and r.outcome.prompt in medians]
    spread = [v / medians[k] for k, vs in later.items() for v in vs if len(vs) > 1]
    first = [r for r in requests if r.position == 1]
    rest = [r for r in requests if r.position > 1]
    return Summary(ratios, statistics.median(x for _, _, x in ratios) if ratios else None,
                   (round(min(spread), 4), round(max(spread), 4)) if spread else None,
                   [r.outcome.tps for r in first], [r.outcome.tps for r in rest],
                   [r.wall_s for r in first], [r.wall_s for r in rest])


def _range(xs: Sequence[float], fmt: str = "{:.2f}") -> str:
    if not xs:
        return "-"
    return (f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-"
            f"{fmt.format(max(xs))})")


def verdict(s: Summary) -> str:
    if s.median is None:
        return "no prompt was answered both first and later: nothing to compare"
    if s.spread is None:
        return (f"request 1 runs at {s.median:.2f}x the later requests (median over prompts); "
                "no prompt was answered twice later, so there is no spread to judge it by")
    low, high = s.spread
    within = low <= s.median <= high
    return (f"request 1 runs at {s.median:.2f}x the later requests (median over prompts); the "
            f"later requests themselves spread {low:.2f}-{high:.2f}x: "
            + ("within it" if within else ("slower than that" if s.median < low
                                           else "faster than that")))


def report(processes: Sequence[Process], head: dict) -> str:
    s = summarise(processes)
    busy = [p.index + 1 for p in processes if p.calibration == MEASURED_BUSY]
    rows = ["| process | calibration | " + " | ".join(f"request {i}" for i in
                                                       range(1, head["requests"] + 1)) + " |",
            "|---|---|" + "---|" * head["requests"]]
    for p in processes:
        cells = [f"{r.outcome.prompt}: {r.outcome.tps:.2f} tok/s, {r.outcome.drafted} drafted, "
                 f"{r.wall_s:.1f} s"
                 if r.ok else f"{r.outcome.prompt}: {r.outcome.error or 'no figures'}"
                 for r in p.requests]
        rows.append(f"| {p.index + 1} | {p.calibration} | " + " | ".join(cells) + " |")
    ratios = ", ".join(f"{prompt} {x:.2f}x (process {p + 1})"
                       for p, prompt, x in s.first_over_later) or "-"
    lines = [f"# The first request of a new serve process: {head['prompts']}", "",
             f"`{head['command']}`", "",
             f"CPU: {head['cpu']}. {head['date']}; load {head['load_before']:.2f} before, "
             f"{head['load_after']:.2f} after. Target {TARGET.filename}, draft {DRAFT.filename}; "
             f"`tandem serve --no-history`, {head['threads']} threads, ctx {head['ctx']}"
             + (f", --parallel {head['parallel']}" if head.get("parallel") else "")
             + f"; greedy, {head['max_tokens']} tokens; {len(processes)} processes of "
             f"{head['requests']} requests, prompts rotated by process; no warm-up.", "",
             *rows, "",
             f"Decode tokens/s: request 1 {_range(s.first_tps)}, requests 2-{head['requests']} "
             f"{_range(s.later_tps)}. Wall s a request: request 1 {_range(s.first_wall_s, '{:.1f}')}, "
             f"later {_range(s.later_wall_s, '{:.1f}')}.", "",
             f"Request 1 over the same prompt's later requests: {ratios}.", "",
             verdict(s) + ".", ""]
    if busy:
        lines += [f"Process(es) {', '.join(map(str, busy))} calibrated on a busy machine (not "
                  "kept): they did not start from a kept calibration, which the claim assumes.",
                  ""]
    return "\n".join(lines)


def serve_argv(port: int, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--threads",
            str(args.threads), "--ctx", str(args.ctx), "--no-history"]
    return argv + (["--parallel", str(args.parallel)] if args.parallel else [])


def starter(args: argparse.Namespace, logs: Path) -> Callable[[], tuple[Server, Callable[[], str]]]:
    """A fresh `tandem serve` with its own log file, and a reader of that log."""
    count = [0]

    def start() -> tuple[Server, Callable[[], str]]:
        count[0] += 1
        log = logs / f"serve-{count[0]}.log"
        port = free_port()
        # Open on 127.0.0.1: a key in the environment would make every request a 401.
        env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
        server = Server(serve_argv(port, args), port, log, env).start()
        return server, lambda: log.read_text(errors="replace")
    return start


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4, help="requests a process (at least 2)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--parallel", type=int, default=None,
                    help="serve's --parallel (default: serve's own)")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--out", type=Path, default=None,
                    help="report folder: table.md and first-request.json (default: print only)")
    args = ap.parse_args(argv)
    if args.processes < 1 or args.requests < 2 or args.max_tokens < 1:
        ap.error("--processes must be at least 1, --requests at least 2, --max-tokens at least 1")
    if args.parallel is not None and args.parallel < 1:
        ap.error("--parallel must be at least 1")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from loading.calibrations import calibrations_dir

    suite = load_suite(args.prompts)
    prompts = {p.id: p for p in suite.prompts}
    try:
        orders = rotations(list(prompts), args.processes, args.requests)
    except ValueError as exc:
        raise SystemExit(f"error: {exc} in {args.prompts}") from None
    for m in (TARGET, DRAFT):
        if not m.path.is_file():
            raise SystemExit(f"error: {m.path} is missing (python -m models.embedded ensure)")
    head = {"command": "python -m bench.first_request " + shlex.join(argv), "cpu": cpu_line(),
            "prompts": f"{suite.name} v{suite.version}",
            "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "load_before": os.getloadavg()[0], "max_tokens": args.max_tokens,
            "threads": args.threads, "ctx": args.ctx, "parallel": args.parallel,
            "requests": args.requests}
    logs = Path(tempfile.mkdtemp(prefix="tandem-first-request-"))
    print(f"# {head['cpu']}; server logs in {logs}", file=sys.stderr, flush=True)
    processes = list(run(orders, prompts, starter(args, logs), args.max_tokens,
                         calibrations_dir(),
                         progress=lambda r: print(json.dumps({**asdict(r.outcome),
                                                              "process": r.process,
                                                              "position": r.position,
                                                              "wall_s": round(r.wall_s, 2)}),
                                                  file=sys.stderr, flush=True)))
    head["load_after"] = os.getloadavg()[0]
    text = report(processes, head)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(text)
        raw = [replace(p, requests=()).__dict__ | {"requests": [
            {**asdict(r.outcome), "position": r.position, "wall_s": r.wall_s}
            for r in p.requests]} for p in processes]
        (args.out / "first-request.json").write_text(json.dumps(
            {"context": head, "processes": raw, "summary": asdict(summarise(processes))},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
