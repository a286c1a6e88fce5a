"""The exactness check: for each sampling setting, draw samples by plain target sampling and by
speculative sampling on one controlled prompt and compare three statistics (first token, first
two tokens jointly, tokens to the first newline).

Decision: a setting PASSES when every statistic's chi-square p-value is at least alpha / 3
(Bonferroni over the three statistics). The negative control draws speculative samples with
`biased_verify` under the first setting and is compared with that setting's direct samples; the
check as a whole holds when every setting passes and the control FAILS.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from engine.drafters.base import Drafter
from engine.errors import SettingsError
from engine.exactness.biased import biased_verify
from engine.exactness.compare import Comparison, compare
from engine.exactness.draws import Draws, draw, statistics
from engine.exactness.greedy import GreedyAgreement, greedy_agreement
from engine.policy import GammaPolicy
from engine.sampling import SamplingParams
from engine.session import Session


@dataclass(frozen=True)
class Setting:
    name: str
    params: SamplingParams


SETTINGS: tuple[Setting, ...] = (
    Setting("temperature 1.0", SamplingParams(temperature=1.0)),
    Setting("temperature 0.7, top-p 0.9", SamplingParams(temperature=0.7, top_p=0.9)),
    Setting("top-k 20", SamplingParams(temperature=1.0, top_k=20)),
    Setting("min-p 0.05", SamplingParams(temperature=1.0, min_p=0.05)),
)


@dataclass(frozen=True)
class ExactnessPlan:
    samples: int = 300
    gamma: int = 3
    cap: int = 12
    alpha: float = 0.01
    seed: int = 0
    greedy_tokens: int = 48
    settings: tuple[Setting, ...] = SETTINGS

    def __post_init__(self) -> None:
        if self.samples < 20:
            raise SettingsError(f"exactness needs at least 20 samples per arm, got {self.samples}")
        if not 1 <= self.gamma <= 32:
            raise SettingsError(f"gamma must be between 1 and 32, got {self.gamma}")
        if self.cap < 2:
            raise SettingsError(f"the newline cap must be >= 2 tokens, got {self.cap}")
        if not 0.0 < self.alpha < 1.0:
            raise SettingsError(f"alpha must be in (0, 1), got {self.alpha}")


@dataclass(frozen=True)
class SettingResult:
    name: str
    params: dict
    rule: str
    comparisons: list[Comparison]
    threshold: float
    acceptance_rate: float
    seconds: float
    # Tokens the speculative arm verified: with none (a policy that stayed plain for every
    # sample), the two arms ran the same plain decoding and the comparison shows nothing.
    drafted: int = 0

    @property
    def passed(self) -> bool:
        return all(c.p_value >= self.threshold for c in self.comparisons)

    @property
    def exercised(self) -> bool:
        return self.drafted > 0


@dataclass
class ExactnessReport:
    plan: ExactnessPlan
    prompt_tokens: int
    results: list[SettingResult] = field(default_factory=list)
    control: SettingResult | None = None
    greedy: GreedyAgreement | None = None

    @property
    def passed(self) -> bool:
        """Every exact setting drafts and passes, and the biased control is caught."""
        return (all(r.passed and r.exercised for r in self.results)
                and (self.control is None or not self.control.passed))


Tick = Callable[[str], None]


def _compare_setting(name: str, params: SamplingParams, rule_name: str, direct: Draws,
                     spec: Draws, token_bytes: Callable[[int], bytes], plan: ExactnessPlan,
                     seconds: float) -> SettingResult:
    rng = np.random.default_rng(plan.seed + 7)
    sa = statistics(direct.samples, token_bytes, plan.cap)
    sb = statistics(spec.samples, token_bytes, plan.cap)
    comparisons = [compare(sa[k], sb[k], k, rng) for k in sa]
    return SettingResult(name=name, params=params.as_dict(), rule=rule_name,
                         comparisons=comparisons, threshold=plan.alpha / len(comparisons),
                         acceptance_rate=spec.acceptance_rate, seconds=seconds,
                         drafted=spec.drafted)


def run_exactness(target: Session, drafter: Drafter, prompt: Sequence[int], plan: ExactnessPlan,
                  greedy_prompts: Sequence[Sequence[int]] = (), control: bool = True,
                  tick: Tick | None = None,
                  policy: Callable[[], GammaPolicy] | None = None,
                  widths: Callable[[int], int] | None = None) -> ExactnessReport:
    """Run every setting, then the negative control, then greedy agreement on `greedy_prompts`.
    `policy` makes the gamma policy of each speculative sample (default: fixed gamma); `widths`
    pads the speculative runs' batches as `Pair.generate` does."""
    token_bytes = target.backend.token_bytes
    report = ExactnessReport(plan=plan, prompt_tokens=len(prompt))

    def ticker(label: str) -> Callable[[], None] | None:
        return (lambda: tick(label)) if tick is not None else None

    control_direct = Draws()
    for k, setting in enumerate(plan.settings):
        t0 = time.perf_counter()
        base = plan.seed * 10_000_000 + k * 1_000_000
        direct = draw(target, None, prompt, setting.params, plan.samples, gamma=0, cap=plan.cap,
                      seed=base, tick=ticker(f"{setting.name}: direct"))
        spec = draw(target, drafter, prompt, setting.params, plan.samples, gamma=plan.gamma,
                    cap=plan.cap, seed=base + 500_000, tick=ticker(f"{setting.name}: speculative"),
                    policy=policy, widths=widths)
        report.results.append(_compare_setting(setting.name, setting.params, "exact", direct, spec,
                                               token_bytes, plan, time.perf_counter() - t0))
        if k == 0:
            control_direct = direct
    if control:
        t0 = time.perf_counter()
        setting = plan.settings[0]
        biased = draw(target, drafter, prompt, setting.params, plan.samples, gamma=plan.gamma,
                      cap=plan.cap, seed=plan.seed * 10_000_000 + 9_000_000, rule=biased_verify,
                      tick=ticker("negative control"), policy=policy, widths=widths)
        report.control = _compare_setting(f"{setting.name} (biased rule: resample from p)",
                                          setting.params, "biased", control_direct, biased,
                                          token_bytes, plan, time.perf_counter() - t0)
    if greedy_prompts:
        report.greedy = greedy_agreement(target, drafter, greedy_prompts, plan.greedy_tokens,
                                         plan.gamma, tick=ticker("greedy agreement"),
                                         widths=widths)
    return report


def total_ticks(plan: ExactnessPlan, n_greedy_prompts: int, control: bool = True) -> int:
    return (2 * len(plan.settings) + int(control)) * plan.samples + n_greedy_prompts
