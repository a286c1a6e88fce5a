"""Concurrent clients on one pair (issue 46): aggregate tokens/s, per-request latency p50/p99
and time to first token p50/p99, for three ways of serving them:

- serial: today's queue (`--parallel 1`), one generation at a time with the default drafter and
  policy, each request's latency counting its wait;
- plain batched: `--parallel P` (default 4) slots (engine/slots.py), no drafting;
- speculative batched: the same slots with the default drafter and policy, which price each
  round at the batch's width.

Clients past P wait for a slot, as `tandem serve` admits them. Then "short after long": a long
request starts, a short one arrives once the long one's first token is out; which ends first,
serially and batched.

On the embedded pair (`--profile real`) every figure is wall time on this machine. On a cost
profile (`--profile gpu`, the measured GPU profile of bench/benchmark/gpu_profile.py, whose label
the table carries, or `cpu-batched`: bench/fakes/costed.py, bench/research/batch_replay.py) the
same `Pair.generate` runs on scripted fakes whose decodes advance a virtual clock by the
profile's cost at the batch's whole width, every client drafting at one acceptance (`--acceptance`);
the figures are then free of noise, though the speculative rows move by a few percent between runs:
the order in which the clients' threads take their first rounds sets the batch each is priced in.

Each run of a cell (a mode at a client count) starts from a pair opened for it and closed after:
no cell sees another's evidence (what the adaptive controller learnt of the drafter:
engine/control/evidence.py), caches or slots' prefixes. Before its clients the pair is warmed
without learning anything: the mode's drafter calibrated (`Pair.calibration`, as its first
generation would) and one short plain request on a prompt of none of the clients' (plain
decoding keeps no evidence), so the figures count neither calibration nor first decodes. Repeats
are interleaved: every cell's first run, then every cell's second, each repeat starting each
client count's modes from the next one, so that a drift of the machine weighs on all modes alike.
The short-after-long pairs are opened afresh likewise.

    PYTHONPATH=. python -m bench.concurrency --clients 1 2 4 8 --max-tokens 32 --repeats 3 --threads 2
    PYTHONPATH=. python -m bench.concurrency --profile gpu --max-tokens 64
"""
from __future__ import annotations

import argparse
import datetime
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from engine.backend import ModelConfig
from engine.control.registry import make_policy
from engine.drafters.base import PLAIN, plain_alias
from engine.events import DoneEvent, Event, TokenEvent
from engine.generation_config import GenerationConfig
from engine.llama.quiet import quiet_llama
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.slots import Run, sequences_for

PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\n\n# ",
           "SELECT name FROM users WHERE", "Once upon a time, a small robot", "<html>\n  <head>\n",
           "fn main() {\n    let", "The three laws of motion are"]
# The warm-up's prompt on the embedded pair: none of the clients' (nor a prefix of theirs).
WARM_PROMPT = "Warm-up, not timed:"
# The warm-up's plain request: enough tokens to run the decode path once.
WARM_TOKENS = 4


@dataclass(frozen=True)
class Mode:
    name: str
    # Slots of the pair (1: the serial queue); the drafter (None: the pair's default).
    batched: bool
    drafter: str | None


MODES = (Mode("serial", False, None), Mode("plain batched", True, "plain"),
         Mode("spec. batched", True, None))


@dataclass(frozen=True)
class Done:
    """One request, in seconds from its arrival: its end, its first token, its tokens."""
    latency: float
    ttft: float
    tokens: int


class Bench:
    """A pair and the clock its figures are read on: wall time, or a cost profile's virtual
    clock (exact: a request's start is read on its slot's thread, where no step can pass)."""

    def __init__(self, pair: Pair, now: Callable[[], float], virtual: bool,
                 prompts: Sequence[str], warm_prompt: str) -> None:
        self.pair = pair
        self.now = now
        self.virtual = virtual
        self.prompts = prompts
        self.warm_prompt = warm_prompt
        self._starts: dict[int, list[float]] = {}
        if virtual and pair.slots is not None:
            slots = pair.slots
            original = slots.stream

            def stream(prompt: Sequence[int], run: Run) -> Iterator[Event]:
                start: list[float] = []
                self._starts[threading.get_ident()] = start

                def timed(slot):  # on the slot's thread, registered with the step
                    start.append(self.now())
                    return run(slot)
                return original(prompt, timed)
            slots.stream = stream  # type: ignore[method-assign]

    def warm(self, config: GenerationConfig, drafter: str | None) -> None:
        """Calibrate `drafter` (None: the pair's default) as its first generation would, to
        what that generation's policy asks (the adaptive controller's need: a copy's width, past
        the request's gamma), then one short plain request on the warm-up prompt: the drafter's
        evidence stays as new."""
        name = self.pair.default_drafter if drafter is None else drafter
        if plain_alias(name) != PLAIN:
            need = make_policy("adaptive", config.gamma).calibration_need()
            self.pair.calibration(name, config.gamma if need is None else need)
        self.request(self.warm_prompt, replace(config, max_tokens=WARM_TOKENS), PLAIN,
                     self.now())

    def request(self, prompt: str, config: GenerationConfig, drafter: str | None,
                arrival: float, first: threading.Event | None = None) -> Done:
        start = self.now()
        ttft = None
        for ev in self.pair.generate(prompt, config, drafter=drafter, raw=True):
            if isinstance(ev, TokenEvent) and ttft is None:
                ttft = self.now() - arrival
                if first is not None:
                    first.set()
            if isinstance(ev, DoneEvent):
                if self.virtual:
                    begun = self._starts.pop(threading.get_ident(), [start]) or [start]
                    s = ev.stats
                    return Done(begun[0] + s.total_time_ms / 1e3 - arrival,
                                begun[0] + s.ttft_ms / 1e3 - arrival, len(ev.tokens))
                return Done(self.now() - arrival, ttft if ttft is not None else 0.0,
                            len(ev.tokens))
        raise RuntimeError("a generation ended without its DoneEvent")

    def clients(self, k: int, config: GenerationConfig, drafter: str | None) -> list[Done]:
        """k clients arriving together; without slots they take turns (the serial queue)."""
        out: list[Done] = []
        t0 = self.now()
        if self.pair.slots is None:
            if self.virtual:  # one thread: the clock is read exactly between requests
                return [self._serial_virtual(self.prompts[i % len(self.prompts)], config,
                                             drafter, t0) for i in range(k)]
            lock = threading.Lock()

            def turn(prompt: str) -> None:
                with lock:
                    out.append(self.request(prompt, config, drafter, t0))
            runs = [(turn, p) for p in self._prompts(k)]
        else:
            def go(prompt: str) -> None:
                out.append(self.request(prompt, config, drafter, t0))
            runs = [(go, p) for p in self._prompts(k)]
        threads = [threading.Thread(target=f, args=(p,)) for f, p in runs]
        if self.virtual and self.pair.slots is not None:
            # All arrive before the first step: a sequence of ours holds the steps meanwhile.
            step, joining = self.pair.slots.step, min(k, self.pair.slots.n)
            with step.sequence():
                for t in threads:
                    t.start()
                while step.sequences < 1 + joining:
                    time.sleep(0.001)
        else:
            for t in threads:
                t.start()
        for t in threads:
            t.join()
        return out

    def _serial_virtual(self, prompt: str, config: GenerationConfig, drafter: str | None,
                        t0: float) -> Done:
        start = self.now()
        d = self.request(prompt, config, drafter, start)
        return Done(d.latency + start - t0, d.ttft + start - t0, d.tokens)

    def _prompts(self, k: int) -> list[str]:
        return [self.prompts[i % len(self.prompts)] for i in range(k)]

    def short_after_long(self, long: GenerationConfig, short: GenerationConfig,
                         drafter: str | None) -> tuple[Done, float, Done]:
        """A long request, then a short one once the long one's first token is out: (the long
        one, the short one's arrival, the short one), in seconds from the long one's arrival."""
        first = threading.Event()
        got: dict[str, Done] = {}
        lock = threading.Lock() if self.pair.slots is None else None
        t0 = self.now()

        def ask(name: str, prompt: str, config: GenerationConfig, arrival: float,
                flag: threading.Event | None) -> None:
            if lock is None:
                got[name] = self.request(prompt, config, drafter, arrival, flag)
                return
            with lock:
                got[name] = self.request(prompt, config, drafter, arrival, flag)
        a = threading.Thread(target=ask, args=("long", self.prompts[0], long, t0, first))
        a.start()
        first.wait()
        arrival = self.now()
        ask("short", self.prompts[1], short, arrival, None)
        a.join()
        return got["long"], arrival - t0, got["short"]


def real_pair(parallel: int, threads: int, n_ctx: int) -> Bench:
    """The embedded pair as `tandem serve --parallel N` loads it (the plan's Q4_0 draft)."""
    from loading.load import load_pair
    from models import embedded
    quiet_llama()
    target, draft = (ModelConfig(str(m.path), n_ctx=n_ctx, n_threads=threads,
                                 n_seq=sequences_for(parallel))
                     for m in (embedded.TARGET, embedded.DRAFT))
    pair = load_pair(target, draft)
    return Bench(pair, time.perf_counter, False, PROMPTS, WARM_PROMPT)


def profile_pair(name: str, parallel: int, acceptance: float) -> Bench:
    """Scripted fakes on `name`'s cost profile, every position drafted right at `acceptance`."""
    from bench.fakes.costed import V, script, scripted_pair
    from bench.research.batch_replay import PROFILES
    profile = next(p for p in PROFILES if p.name == name)
    s = script(lambda k: acceptance, seed=46)
    pair, clock = scripted_pair(profile, s, parallel=parallel)
    # The fakes answer any prompt by its length: the warm-up's shares no prefix with the script's.
    warm = " ".join(str(t % (V - 1) + 1) for t in s.prompt)
    return Bench(pair, lambda: clock.now() / 1e3, True, [s.prompt_text], warm)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def row(mode: str, k: int, done: list[Done], repeats: int) -> dict:
    lat = [d.latency for d in done]
    ttft = [d.ttft for d in done]
    # Each repeat's clients arrive together: its wall time is its slowest request.
    walls = [max(lat[i:i + k]) for i in range(0, len(lat), k)]
    return {"clients": k, "mode": mode, "requests": len(done), "repeats": repeats,
            "tok_s": sum(d.tokens for d in done) / sum(walls),
            "p50_s": pct(lat, 50), "p99_s": pct(lat, 99),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99)}


HEADER = ("| clients | mode | tok/s (all clients) | latency p50 s | latency p99 s | TTFT p50 s | "
          "TTFT p99 s |\n|---:|---|---:|---:|---:|---:|---:|")


def line(r: dict) -> str:
    return (f"| {r['clients']} | {r['mode']} | {r['tok_s']:.1f} | {r['p50_s']:.2f} | "
            f"{r['p99_s']:.2f} | {r['ttft_p50_s']:.2f} | {r['ttft_p99_s']:.2f} |")


def cpu_name() -> str:
    for text in Path("/proc/cpuinfo").read_text().splitlines():
        if text.startswith("model name"):
            return text.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    return "unknown"


def opened(make: Callable[[int], Bench], mode: Mode, parallel: int,
           config: GenerationConfig) -> Bench:
    """A pair opened for one run of `mode` (`parallel` slots when batched), warmed up."""
    b = make(parallel if mode.batched else 1)
    try:
        b.warm(config, mode.drafter)
    except BaseException:
        b.pair.close()
        raise
    return b


def run_cell(make: Callable[[int], Bench], mode: Mode, parallel: int, k: int,
             config: GenerationConfig) -> list[Done]:
    """One run of a cell: `k` clients in `mode` on a pair opened for them and closed after."""
    b = opened(make, mode, parallel, config)
    try:
        return b.clients(k, config, mode.drafter)
    finally:
        b.pair.close()


def run_table(make: Callable[[int], Bench], clients: Sequence[int], parallel: int,
              repeats: int, config: GenerationConfig) -> list[dict]:
    """Every (mode, client count) cell's row, pooled over `repeats` runs: every cell's first
    run, then every cell's second, and so on, each repeat taking each client count's modes from
    the next one on (repeat r starts with mode r)."""
    done: dict[tuple[int, str], list[Done]] = {(k, m.name): [] for k in clients for m in MODES}
    for r in range(repeats):
        for k in clients:
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                got = run_cell(make, mode, parallel, k, config)
                done[k, mode.name] += got
                print(f"  run {r + 1}/{repeats}: {k} clients, {mode.name}: "
                      f"{sum(d.tokens for d in got)} tokens, slowest "
                      f"{max(d.latency for d in got):.2f} s", flush=True)
    return [row(m.name, k, done[k, m.name], repeats) for k in clients for m in MODES]


def short_after_long(make: Callable[[int], Bench], args: argparse.Namespace,
                     config: Callable[[int], GenerationConfig]) -> list[str]:
    """The short-after-long table, serially and batched, each on a pair opened for it."""
    out = ["", f"Short after long: a {args.long_tokens}-token request, then a "
           f"{args.short_tokens}-token one once the first one's first token is out "
           "(seconds from the long one's arrival):", "",
           "| mode | long ends | short arrives | short's first token | short ends | "
           "short ends first |", "|---|---:|---:|---:|---:|---|"]
    for mode in (MODES[0], MODES[2]):
        b = opened(make, mode, args.parallel, config(args.long_tokens))
        try:
            long, at, short = b.short_after_long(config(args.long_tokens),
                                                 config(args.short_tokens), mode.drafter)
        finally:
            b.pair.close()
        out.append(f"| {mode.name} | {long.latency:.2f} | {at:.2f} | {at + short.ttft:.2f} | "
                   f"{at + short.latency:.2f} | "
                   f"{'yes' if at + short.latency < long.latency else 'no'} |")
        print(out[-1], flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--parallel", type=int, default=4, help="the batched modes' slots")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each cell, interleaved, pooled")
    ap.add_argument("--long-tokens", type=int, default=96, help="short after long: the long one")
    ap.add_argument("--short-tokens", type=int, default=8, help="short after long: the short one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", default="real", choices=["real", "gpu", "cpu", "cpu-batched"])
    ap.add_argument("--acceptance", type=float, default=0.8, help="a cost profile's acceptance")
    ap.add_argument("--out", type=Path, default=None, help="write the table to OUT")
    args = ap.parse_args(argv)

    def config(n: int) -> GenerationConfig:
        return GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8, max_tokens=n)

    def make(parallel: int) -> Bench:
        if args.profile == "real":
            return real_pair(parallel, args.threads, 1024)
        return profile_pair(args.profile, parallel, args.acceptance)

    def cost_profile() -> str:
        from bench.research.batch_replay import PROFILES
        label = next(p.label for p in PROFILES if p.name == args.profile)
        return f"the {args.profile} cost profile: {label};" if label else f"the {args.profile} cost profile,"

    started = datetime.datetime.now(datetime.timezone.utc)
    out = [f"Concurrent clients, greedy, {args.max_tokens} tokens a request, "
           f"{args.repeats} run(s) of each cell, interleaved, each on a pair opened for it; "
           f"batched modes with {args.parallel} slots. "
           + ("Wall time on the embedded pair, --threads "
              f"{args.threads}; CPU: {cpu_name()}; load before: "
              f"{os.getloadavg()[0]:.2f}" if args.profile == "real" else
              f"Virtual time on {cost_profile()} acceptance {args.acceptance}")
           + f"; started {started:%Y-%m-%d %H:%M} UTC.", "", HEADER]
    print("\n".join(out), flush=True)
    rows = run_table(make, args.clients, args.parallel, args.repeats, config(args.max_tokens))
    out += [line(r) for r in rows]
    print("\n".join(out[-len(rows):]), flush=True)
    if args.profile == "real":
        out += short_after_long(make, args, config)
    ended = datetime.datetime.now(datetime.timezone.utc)
    out += ["", f"Ended {ended:%H:%M} UTC"
            + (f", load after: {os.getloadavg()[0]:.2f}." if args.profile == "real" else ".")]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(out) + "\n")
    print(out[-1])


if __name__ == "__main__":
    main()
