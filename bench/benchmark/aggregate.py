"""Aggregation of run records into the numbers the report shows.

Speculative runs are grouped by configuration and sampling setting. For each group: the
distribution of speedup over the paired baselines per category and overall (median, p10, p90,
fraction of prompts slower than baseline; the share of tokens a grammar forced, decode tokens/s
and the measured GPU profile's prediction beside them), the gamma sweep with its latency-optimal gamma (the
highest median speedup) next to its acceptance-optimal gamma (the highest acceptance rate), the
Amdahl view, the Leviathan prediction (see `theory`), and acceptance by draft position and by
position in the output.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

from bench.benchmark.gpu_profile import available
from bench.benchmark.records import RunRecord
from bench.benchmark.theory import (amdahl_speedup, expected_tokens_per_round, gpu_profile_speedup,
                                          predicted_speedup)

OVERALL = "overall"


def sampling_label(r: RunRecord) -> str:
    if r.temperature == 0.0:
        return "greedy"
    parts = [f"t={r.temperature:g}"]
    if r.top_k:
        parts.append(f"top-k={r.top_k}")
    if r.top_p < 1.0:
        parts.append(f"top-p={r.top_p:g}")
    if r.min_p > 0.0:
        parts.append(f"min-p={r.min_p:g}")
    return " ".join(parts)


@dataclass(frozen=True)
class Quantiles:
    n: int
    median: float
    p10: float
    p90: float


def quantiles(values: Iterable[float | None]) -> Quantiles:
    """Count, median, p10 and p90 of the finite values (None: not measured)."""
    xs = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if xs.size == 0:
        return Quantiles(0, float("nan"), float("nan"), float("nan"))
    p10, med, p90 = np.percentile(xs, [10, 50, 90])
    return Quantiles(int(xs.size), float(med), float(p10), float(p90))


@dataclass(frozen=True)
class SpeedupRow:
    config: str
    sampling: str
    category: str
    speedup: Quantiles
    e2e_speedup: Quantiles
    fraction_slower: float
    acceptance_rate: float
    tokens_per_target_call: float
    # Output tokens a grammar forced, over all output tokens (pooled; 0 without a grammar).
    forced_share: float = 0.0
    # Median decode tokens/s of the speculative runs and of their paired baselines.
    tokens_per_s: float = float("nan")
    baseline_tokens_per_s: float = float("nan")
    # Median predicted speedup of the same rounds on the measured GPU profile (theory.py).
    gpu_profile: float = float("nan")


@dataclass(frozen=True)
class SweepPoint:
    drafter: str
    policy: str
    sampling: str
    gamma: int
    speedup: Quantiles
    acceptance_rate: float
    tokens_per_target_call: float


@dataclass(frozen=True)
class SweepBest:
    drafter: str
    policy: str
    sampling: str
    latency_optimal_gamma: int
    latency_optimal_speedup: float
    acceptance_optimal_gamma: int
    acceptance_optimal_rate: float


@dataclass(frozen=True)
class AmdahlRow:
    config: str
    sampling: str
    prefill_share: float
    decode_speedup: float
    allowed_e2e_speedup: float
    measured_e2e_speedup: float


@dataclass(frozen=True)
class LeviathanRow:
    config: str
    sampling: str
    alpha: float
    gamma: float
    cost_ratio: float
    verify_ratio: float
    expected_tokens_per_round: float
    measured_tokens_per_round: float
    predicted_speedup: float
    measured_speedup: float


@dataclass(frozen=True)
class PositionCurve:
    config: str
    sampling: str
    # Acceptance rate at draft position i (pooled over every round of every run).
    by_draft_position: list[float]
    # Share of output tokens at positions [k*bucket, (k+1)*bucket) that were accepted drafts.
    by_output_position: list[float]
    bucket: int


@dataclass
class Summary:
    speedups: list[SpeedupRow] = field(default_factory=list)
    sweep: list[SweepPoint] = field(default_factory=list)
    sweep_best: list[SweepBest] = field(default_factory=list)
    amdahl: list[AmdahlRow] = field(default_factory=list)
    leviathan: list[LeviathanRow] = field(default_factory=list)
    positions: list[PositionCurve] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _groups(records: Sequence[RunRecord], key) -> dict[tuple, list[RunRecord]]:
    out: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in records:
        if r.role == "speculative":
            out[key(r)].append(r)
    return out


def _pooled_acceptance(runs: Sequence[RunRecord]) -> float:
    drafted = sum(r.drafted_tokens for r in runs)
    return sum(r.accepted_tokens for r in runs) / drafted if drafted else 0.0


def _pooled_tokens_per_call(runs: Sequence[RunRecord]) -> float:
    calls = sum(r.target_calls for r in runs)
    return sum(r.output_tokens for r in runs) / calls if calls else 0.0


def _forced_share(runs: Sequence[RunRecord]) -> float:
    out = sum(r.output_tokens for r in runs)
    return sum(r.forced_tokens for r in runs) / out if out else 0.0


def gpu_profile(r: RunRecord) -> float:
    """The run's predicted speedup on the measured GPU profile (theory.py); NaN where this
    install has none."""
    profile = available()
    if profile is None:
        return float("nan")
    return gpu_profile_speedup(r.output_tokens, r.target_calls, r.drafted_at,
                               r.drafted_by.get("draft-model", 0), profile)


def speedup_rows(records: Sequence[RunRecord]) -> list[SpeedupRow]:
    rows = []
    base = _baselines(records)
    for (config, sampling), runs in _groups(records, lambda r: (r.config, sampling_label(r))).items():
        by_cat: dict[str, list[RunRecord]] = defaultdict(list)
        for r in runs:
            by_cat[r.category].append(r)
        for cat, sub in [*by_cat.items(), (OVERALL, runs)]:
            speedups = [r.speedup for r in sub if r.speedup is not None]
            rows.append(SpeedupRow(
                config=config, sampling=sampling, category=cat, speedup=quantiles(speedups),
                e2e_speedup=quantiles(r.e2e_speedup for r in sub),
                fraction_slower=float(np.mean([s < 1.0 for s in speedups])) if speedups else float("nan"),
                acceptance_rate=_pooled_acceptance(sub),
                tokens_per_target_call=_pooled_tokens_per_call(sub),
                forced_share=_forced_share(sub),
                tokens_per_s=quantiles(r.tokens_per_s for r in sub).median,
                baseline_tokens_per_s=quantiles(base[r.baseline_order].tokens_per_s for r in sub
                                                if r.baseline_order in base).median,
                gpu_profile=quantiles(gpu_profile(r) for r in sub).median))
    return rows


def gamma_sweep(records: Sequence[RunRecord]) -> tuple[list[SweepPoint], list[SweepBest]]:
    points: list[SweepPoint] = []
    best: list[SweepBest] = []
    by_line = _groups(records, lambda r: (r.drafter, r.policy, sampling_label(r)))
    for (drafter, policy, sampling), runs in by_line.items():
        by_gamma: dict[int, list[RunRecord]] = defaultdict(list)
        for r in runs:
            by_gamma[r.gamma].append(r)
        line = [SweepPoint(drafter, policy, sampling, g, quantiles(r.speedup for r in sub),
                           _pooled_acceptance(sub), _pooled_tokens_per_call(sub))
                for g, sub in sorted(by_gamma.items())]
        points.extend(line)
        measured = [p for p in line if p.speedup.n]
        if measured:
            fastest = max(measured, key=lambda p: p.speedup.median)
            surest = max(line, key=lambda p: p.acceptance_rate)
            best.append(SweepBest(drafter, policy, sampling, fastest.gamma, fastest.speedup.median,
                                  surest.gamma, surest.acceptance_rate))
    return points, best


def _baselines(records: Sequence[RunRecord]) -> dict[int | None, RunRecord]:
    """The baseline runs by order; a run's `baseline_order` (None when unpaired) finds its own."""
    return {r.order: r for r in records if r.role == "baseline"}


def amdahl_rows(records: Sequence[RunRecord]) -> list[AmdahlRow]:
    base = _baselines(records)
    rows = []
    for (config, sampling), runs in _groups(records, lambda r: (r.config, sampling_label(r))).items():
        paired = [r for r in runs if r.baseline_order in base and r.speedup]
        if not paired:
            continue
        share = float(np.median([base[r.baseline_order].prefill_share for r in paired]))
        decode = quantiles(r.speedup for r in paired).median
        rows.append(AmdahlRow(config, sampling, share, decode, amdahl_speedup(share, decode),
                              quantiles(r.e2e_speedup for r in paired).median))
    return rows


def leviathan_rows(records: Sequence[RunRecord]) -> list[LeviathanRow]:
    """Prediction from pooled acceptance and the median measured cost ratios of each group."""
    base = _baselines(records)
    rows = []
    for (config, sampling), runs in _groups(records, lambda r: (r.config, sampling_label(r))).items():
        paired = [r for r in runs if r.baseline_order in base and r.drafted_tokens and r.target_calls
                  and base[r.baseline_order].output_tokens]
        if not paired:
            continue
        unit = {r.order: base[r.baseline_order].decode_ms_per_token for r in paired}
        # Per token the draft decoded, trimmed ones included.
        c = float(np.median([r.draft_ms / r.drafted_tokens / unit[r.order]
                             for r in paired]))
        v = float(np.median([r.verify_ms / r.target_calls / unit[r.order] for r in paired]))
        alpha = _pooled_acceptance(paired)
        gamma = float(np.mean([r.mean_gamma for r in paired]))
        rows.append(LeviathanRow(
            config=config, sampling=sampling, alpha=alpha, gamma=gamma, cost_ratio=c,
            verify_ratio=v, expected_tokens_per_round=expected_tokens_per_round(alpha, gamma),
            measured_tokens_per_round=_pooled_tokens_per_call(paired),
            predicted_speedup=(predicted_speedup(alpha, gamma, c, v) if gamma * c + v > 0
                               else float("nan")),
            measured_speedup=quantiles(r.speedup for r in paired).median))
    return rows


def position_curves(records: Sequence[RunRecord], bucket: int = 8) -> list[PositionCurve]:
    curves = []
    for (config, sampling), runs in _groups(records, lambda r: (r.config, sampling_label(r))).items():
        width = max((len(r.drafted_at) for r in runs), default=0)
        drafted = np.zeros(width, dtype=np.int64)
        accepted = np.zeros(width, dtype=np.int64)
        for r in runs:
            drafted[:len(r.drafted_at)] += np.asarray(r.drafted_at, dtype=np.int64)
            accepted[:len(r.accepted_at)] += np.asarray(r.accepted_at, dtype=np.int64)
        by_draft = [float(a / d) if d else 0.0 for a, d in zip(accepted, drafted)]
        length = max((len(r.origins) for r in runs), default=0)
        n_buckets = (length + bucket - 1) // bucket
        hits = np.zeros(n_buckets, dtype=np.int64)
        seen = np.zeros(n_buckets, dtype=np.int64)
        for r in runs:
            for i, origin in enumerate(r.origins):
                seen[i // bucket] += 1
                hits[i // bucket] += origin == "draft"
        by_output = [float(h / s) if s else 0.0 for h, s in zip(hits, seen)]
        curves.append(PositionCurve(config, sampling, by_draft, by_output, bucket))
    return curves


def summarize(records: Sequence[RunRecord]) -> Summary:
    points, best = gamma_sweep(records)
    return Summary(speedups=speedup_rows(records), sweep=points, sweep_best=best,
                   amdahl=amdahl_rows(records), leviathan=leviathan_rows(records),
                   positions=position_curves(records))
