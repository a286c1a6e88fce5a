"""The decision: per category, the candidate with the best median speedup over plain decoding,
if it drafted at all and its median clears plain by MIN_GAIN; otherwise "plain" (plain decoding). Latency decides, not acceptance:
a draft that is right more often but costs more per token can lose.

The table gives, per candidate: acceptance (accepted over drafted tokens, pooled), draft cost
(milliseconds per drafted token over the target's plain milliseconds per token, median over
prompts), and the speedup's median and 10th percentile over its prompts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bench.benchmark.aggregate import Quantiles, quantiles
from models.candidate import Candidate
from bench.tuning.measure import CandidateResult, PairRun

OVERALL = "overall"
# A smaller win is not told apart from the noise of interleaved runs on a shared CPU (plain
# against plain differs by a few percent there), so it would pin a configuration on luck. A
# candidate that drafted nothing ran plain decoding: its "speedup" is noise by construction.
MIN_GAIN = 1.03


@dataclass(frozen=True)
class Row:
    candidate: Candidate
    n: int
    drafted: int
    acceptance: float
    draft_cost: float
    speedup: Quantiles
    note: str


def _runs(res: CandidateResult, category: str) -> list[PairRun]:
    return [r for r in res.runs if category == OVERALL or r.category == category]


def row(res: CandidateResult, category: str = OVERALL) -> Row:
    runs = _runs(res, category)
    drafted = sum(r.drafted for r in runs)
    costs = [r.draft_ms / r.drafted / r.plain_ms_per_token for r in runs
             if r.drafted and r.plain_ms_per_token > 0]
    return Row(res.candidate, len(runs), drafted, sum(r.accepted for r in runs) / drafted if drafted else 0.0,
               float(np.median(costs)) if costs else 0.0, quantiles(r.speedup for r in runs),
               res.error or res.stopped)


def table(results: Sequence[CandidateResult], category: str = OVERALL) -> list[Row]:
    return [row(r, category) for r in results]


def choose(results: Sequence[CandidateResult], category: str = OVERALL) -> Row | None:
    """The fastest candidate in `category`, or None when none beats plain decoding."""
    rows = [row(res, category) for res in results if not res.error]
    rows = [r for r in rows if r.n and r.drafted]
    best = max(rows, key=lambda r: r.speedup.median, default=None)
    return best if best is not None and best.speedup.median >= MIN_GAIN else None


def categories(results: Sequence[CandidateResult]) -> list[str]:
    """Categories in the order their prompts were first measured."""
    return list(dict.fromkeys(r.category for res in results for r in res.runs))
