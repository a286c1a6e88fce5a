"""The tuning loop: each candidate side by side with plain decoding of the same target, on the
same prompts under the same sampling, within a time budget, stopping a candidate that clearly
loses.

Fairness: every pair of runs (plain, candidate) uses the same prompt and seed, from cold caches
(the host's job), and their order alternates from pair to pair, so machine drift and warm CPU
caches favour neither side. Each candidate is compared only with the plain runs interleaved with
its own, so a machine that slows down later in the budget shifts both sides alike.

Budget: candidates are measured one after another (only one candidate's files are loaded at a
time); each gets an equal share of the time left when it starts, so time a losing candidate does
not use goes to the ones after it. Every candidate gets at least one pair.

Early stop ("clearly loses"), after at least MIN_PAIRS_TO_STOP pairs:
- every pair so far was slower than plain decoding. Under a true median speedup of 1 that happens
  with probability 1/2^n (a one-sided sign test: 1/8 at n = 3), and the decision rule never
  picks a candidate slower than plain anyway; or
- every pair so far was slower than the leader's median (the best median over 1.0 among the
  candidates already measured): on the same prompts, in the same order, it is behind on each.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from bench.benchmark.suite import SuitePrompt
from engine.errors import TandemError
from engine.sampling import SamplingParams
from engine.stats import GenerationStats
from models.candidate import Candidate

MIN_PAIRS_TO_STOP = 3


class TuneHost(ABC):
    """What the loop needs of the models: load a candidate, run one generation, unload."""

    @abstractmethod
    def open(self, candidate: Candidate) -> None:
        """Derive and load what `candidate` needs (TandemError if it cannot)."""

    @abstractmethod
    def run(self, candidate: Candidate | None, prompt: SuitePrompt,
            params: SamplingParams) -> GenerationStats:
        """One generation from cold caches: `candidate` None is plain decoding."""

    @abstractmethod
    def close(self, candidate: Candidate) -> None:
        """Free what `open` loaded."""


@dataclass(frozen=True)
class PairRun:
    prompt_id: str
    category: str
    plain_tps: float
    tps: float
    drafted: int
    accepted: int
    draft_ms: float
    plain_ms_per_token: float

    @property
    def speedup(self) -> float:
        return self.tps / self.plain_tps if self.plain_tps > 0 else 0.0


@dataclass
class CandidateResult:
    candidate: Candidate
    runs: list[PairRun] = field(default_factory=list)
    # Why measuring stopped before the last prompt ("" when it ran them all).
    stopped: str = ""
    # Why the candidate could not be measured at all (it is then never chosen).
    error: str = ""

    @property
    def speedups(self) -> list[float]:
        return [r.speedup for r in self.runs]


@dataclass(frozen=True)
class TuneProgress:
    done: int
    expected: int
    eta_s: float
    label: str


def clearly_loses(speedups: Sequence[float], leader_median: float | None) -> str:
    """Why a candidate with these speedups so far clearly loses, or "" (module docstring)."""
    n = len(speedups)
    if n < MIN_PAIRS_TO_STOP:
        return ""
    if max(speedups) < 1.0:
        return f"slower than plain on all {n} prompts"
    if leader_median is not None and max(speedups) < leader_median:
        return f"below the leader's median {leader_median:.2f}x on all {n} prompts"
    return ""


def leader_median(results: Sequence[CandidateResult]) -> float | None:
    medians = [float(np.median(r.speedups)) for r in results
               if len(r.runs) >= MIN_PAIRS_TO_STOP and not r.error]
    best = max(medians, default=None)
    return best if best is not None and best > 1.0 else None


def _pair(host: TuneHost, c: Candidate, prompt: SuitePrompt, params: SamplingParams,
          plain_first: bool) -> PairRun:
    if plain_first:
        plain = host.run(None, prompt, params)
        spec = host.run(c, prompt, params)
    else:
        spec = host.run(c, prompt, params)
        plain = host.run(None, prompt, params)
    return PairRun(prompt.id, prompt.category, plain.tokens_per_s, spec.tokens_per_s,
                   spec.drafted_tokens, spec.accepted_tokens, spec.draft_time_ms,
                   plain.decode_time_ms / plain.output_tokens if plain.output_tokens else 0.0)


def measure(host: TuneHost, candidates: Sequence[Candidate], prompts: Sequence[SuitePrompt],
            params: SamplingParams, budget_s: float,
            progress: Callable[[TuneProgress], None] | None = None,
            now: Callable[[], float] = time.monotonic) -> list[CandidateResult]:
    """Measure every candidate (module docstring); results in the candidates' order."""
    start = now()
    deadline = start + budget_s
    results: list[CandidateResult] = []
    pair_s: list[float] = []
    done = 0
    for i, c in enumerate(candidates):
        res = CandidateResult(c)
        results.append(res)
        share_end = now() + max(0.0, deadline - now()) / (len(candidates) - i)
        try:
            host.open(c)
        except TandemError as exc:
            res.error = str(exc)
            continue
        try:
            for j, prompt in enumerate(prompts):
                if j and now() >= share_end:
                    res.stopped = f"its share of the budget, after {j} prompts"
                    break
                t0 = now()
                seeded = params if params.greedy else _seeded(params, j)
                res.runs.append(_pair(host, c, prompt, seeded, plain_first=done % 2 == 0))
                pair_s.append(now() - t0)
                done += 1
                why = clearly_loses(res.speedups, leader_median(results[:-1]))
                if progress is not None:
                    progress(_progress(done, pair_s, deadline - now(), len(prompts) - j - 1,
                                       len(candidates) - i - 1, len(prompts),
                                       f"{c.name} {prompt.id} x{res.runs[-1].speedup:.2f}"))
                if why:
                    res.stopped = why
                    break
        finally:
            host.close(c)
    return results


def _seeded(params: SamplingParams, j: int) -> SamplingParams:
    return replace(params, seed=(params.seed or 0) * 1_000_003 + j)


def _progress(done: int, pair_s: Sequence[float], left_s: float, rest_of_this: int,
              later: int, n_prompts: int, label: str) -> TuneProgress:
    """Pairs done, pairs expected in all and seconds left: what remains at the mean pair time,
    capped by the budget left."""
    mean = float(np.mean(pair_s)) if pair_s else 0.0
    remaining = rest_of_this + later * n_prompts
    if mean > 0:
        remaining = min(remaining, int(max(0.0, left_s) / mean) + later)
    return TuneProgress(done, done + remaining, min(max(0.0, left_s), remaining * mean), label)
