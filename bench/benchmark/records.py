"""One benchmark run as a flat record: what was asked, what the generator measured, and the
speedup over the paired baseline run (same prompt, same target, same sampling, no drafter).

Speedups: `speedup` is the ratio of decode throughputs (output tokens per second after
prefill), so runs whose outputs differ in length still compare; `e2e_speedup` is the ratio of
end-to-end milliseconds per output token, prefill included.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from engine.drafters.base import PLAIN
from engine.sampling import SamplingParams
from engine.stats import GenerationStats


@dataclass
class RunRecord:
    order: int
    prompt_id: str
    category: str
    # "baseline" or "speculative"; "-repeat" appended for the later runs of a repeated group
    role: str
    config: str
    drafter: str
    policy: str
    gamma: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    batch_size: int
    prompt_tokens: int
    output_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    rejected_rounds: int
    rounds: int
    target_calls: int
    acceptance_rate: float
    accepted_per_target_call: float
    tokens_per_target_call: float
    mean_gamma: float
    draft_ms: float
    verify_ms: float
    prefill_ms: float
    ttft_ms: float
    total_ms: float
    decode_ms: float
    tokens_per_s: float
    finish_reason: str
    # Output tokens a grammar forced (committed without a model; 0 without a grammar, and in
    # plain decoding, where the target decodes every token).
    forced_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    acceptance_by_position: list[float] = field(default_factory=list)
    # Drafted and accepted tokens per drafting part ("draft-model", "prompt-lookup", "suffix").
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    # Origin of every output token ("draft" = an accepted drafted token).
    origins: list[str] = field(default_factory=list)
    # Drafted, including tokens the policy trimmed before verification.
    baseline_order: int | None = None
    speedup: float | None = None
    e2e_speedup: float | None = None

    @property
    def ms_per_token_e2e(self) -> float:
        return self.total_ms / self.output_tokens if self.output_tokens else float("inf")

    @property
    def decode_ms_per_token(self) -> float:
        return self.decode_ms / self.output_tokens if self.output_tokens else float("inf")

    @property
    def prefill_share(self) -> float:
        return self.prefill_ms / self.total_ms if self.total_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def record_from_stats(stats: GenerationStats, *, order: int, prompt_id: str, category: str,
                      config: str, policy: str, params: SamplingParams) -> RunRecord:
    speculative = stats.mode == "speculative"
    return RunRecord(
        order=order, prompt_id=prompt_id, category=category,
        role="speculative" if speculative else "baseline", config=config,
        drafter=stats.drafter, policy=policy if speculative else PLAIN, gamma=stats.gamma,
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
        min_p=params.min_p, seed=params.seed, batch_size=1,
        prompt_tokens=stats.prompt_tokens, output_tokens=stats.output_tokens,
        drafted_tokens=stats.drafted_tokens, accepted_tokens=stats.accepted_tokens,
        rejected_rounds=stats.rejected_rounds, rounds=stats.rounds,
        forced_tokens=stats.forced_tokens, target_calls=stats.target_calls, acceptance_rate=stats.acceptance_rate,
        accepted_per_target_call=stats.accepted_per_target_call,
        tokens_per_target_call=stats.tokens_per_target_call,
        mean_gamma=sum(stats.gammas) / len(stats.gammas) if stats.gammas else 0.0,
        draft_ms=stats.draft_time_ms, verify_ms=stats.verify_time_ms,
        prefill_ms=stats.prefill_ms, ttft_ms=stats.ttft_ms, total_ms=stats.total_time_ms,
        decode_ms=stats.decode_time_ms, tokens_per_s=stats.tokens_per_s,
        finish_reason=stats.finish_reason, drafted_at=list(stats.drafted_at),
        drafted_by=dict(stats.drafted_by), accepted_by=dict(stats.accepted_by),
        accepted_at=list(stats.accepted_at),
        acceptance_by_position=list(stats.acceptance_by_position),
        origins=list(stats.origins))


def pair_with(run: RunRecord, baseline: RunRecord) -> None:
    """Set the run's speedups over its baseline run."""
    pair_with_median([run], [baseline])


def pair_with_median(runs: Sequence[RunRecord], baselines: Sequence[RunRecord]) -> None:
    """Set every run's speedups to those of the medians: median decode tokens/s of `runs` over
    that of `baselines` (repeats of one prompt), and likewise for end-to-end time per token.
    With one run each this is the plain ratio."""
    base_tps = float(np.median([b.tokens_per_s for b in baselines]))
    spec_tps = float(np.median([r.tokens_per_s for r in runs]))
    ok = all(r.output_tokens for r in runs) and all(b.output_tokens for b in baselines)
    base_e2e = float(np.median([b.ms_per_token_e2e for b in baselines]))
    spec_e2e = float(np.median([r.ms_per_token_e2e for r in runs]))
    for run in runs:
        run.baseline_order = baselines[0].order
        run.speedup = spec_tps / base_tps if base_tps > 0 else None
        run.e2e_speedup = base_e2e / spec_e2e if ok else None
