"""The exactness check: for each sampling setting, draw answers by plain target sampling and by
speculative sampling on one controlled prompt, and compare, at every position from `first` on,
the law of the pair of tokens there (two-sample chi-square, rare categories pooled).

`first` skips the positions no draft can reach: a fresh adaptive controller decodes its opening
tokens plainly, and comparing plain decoding with itself shows nothing. Each setting reports,
per position, how many speculative answers took their token there from a draft, and the
smallest bias the comparison would catch (`detectable_tv`).

Decision: a setting PASSES when every position's p-value is at least alpha / positions
(Bonferroni). The negative control (`CalibratedBias`, a bias of total variation `control_tv` on
each verified round's first token) runs under the first setting against that setting's direct
answers; the check as a whole holds when every setting drafts and passes and the control FAILS.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from engine.drafters.base import Drafter
from engine.errors import SettingsError
from bench.exactness.biased import CalibratedBias
from bench.exactness.compare import Comparison, compare, detectable_tv
from bench.exactness.draws import Draws, draw, statistics
from bench.exactness.greedy import GreedyAgreement, greedy_agreement
from engine.control.policy import GammaPolicy
from engine.sampling import SamplingParams
from engine.session import Session


@dataclass(frozen=True)
class Setting:
    name: str
    params: SamplingParams
    key: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting("temperature 1.0", SamplingParams(temperature=1.0), "t1"),
    Setting("temperature 0.7, top-p 0.9", SamplingParams(temperature=0.7, top_p=0.9), "t0.7"),
    Setting("top-k 20", SamplingParams(temperature=1.0, top_k=20), "topk20"),
    Setting("min-p 0.05", SamplingParams(temperature=1.0, min_p=0.05), "minp0.05"),
)


def settings_named(names: str) -> tuple[Setting, ...]:
    """Settings by key, comma-separated, or "all"."""
    if names == "all":
        return SETTINGS
    by_key = {s.key: s for s in SETTINGS}
    chosen = []
    for key in (k.strip() for k in names.split(",") if k.strip()):
        if key not in by_key:
            raise SettingsError(f"unknown exactness setting {key!r}; choose from "
                                f"{', '.join(by_key)} or all")
        chosen.append(by_key[key])
    if not chosen:
        raise SettingsError("exactness needs at least one setting")
    return tuple(chosen)


@dataclass(frozen=True)
class ExactnessPlan:
    samples: int = 300
    gamma: int = 3
    # Tokens per answer, and the first position compared.
    tokens: int = 7
    first: int = 0
    alpha: float = 0.01
    seed: int = 0
    greedy_tokens: int = 48
    # The negative control's bias (total variation added to a verified round's first token).
    control_tv: float = 0.03
    settings: tuple[Setting, ...] = SETTINGS

    def __post_init__(self) -> None:
        if self.samples < 20:
            raise SettingsError(f"exactness needs at least 20 samples per arm, got {self.samples}")
        if not 1 <= self.gamma <= 32:
            raise SettingsError(f"gamma must be between 1 and 32, got {self.gamma}")
        if not 0 <= self.first < self.tokens:
            raise SettingsError(f"the first compared position must be in [0, tokens), got "
                                f"{self.first} with {self.tokens} tokens")
        if not 0.0 < self.alpha < 1.0:
            raise SettingsError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0.0 < self.control_tv < 1.0:
            raise SettingsError(f"the control's bias must be in (0, 1), got {self.control_tv}")

    @property
    def positions(self) -> range:
        return range(self.first, self.tokens)


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
    # Per compared position, the share of speculative answers whose token came from a draft.
    drafted_share: tuple[float, ...] = ()
    # Per compared position, the smallest bias (TV) the comparison catches with power 0.8.
    detectable: tuple[float, ...] = ()
    # The control's measured bias per verified round (0 for exact settings).
    bias_tv: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.p_value >= self.threshold for c in self.comparisons)

    @property
    def exercised(self) -> bool:
        return self.drafted > 0

    @property
    def smallest_detectable(self) -> float:
        return min(self.detectable) if self.detectable else 1.0


@dataclass
class ExactnessReport:
    plan: ExactnessPlan
    prompt_tokens: int
    results: list[SettingResult] = field(default_factory=list)
    control: SettingResult | None = None
    greedy: GreedyAgreement | None = None

    @property
    def passed(self) -> bool:
        """Every exact setting drafts and passes, the biased control is caught, and greedy
        outputs part only at near-ties."""
        return (all(r.passed and r.exercised for r in self.results)
                and (self.control is None or not self.control.passed)
                and (self.greedy is None or not self.greedy.unexplained))


Tick = Callable[[str], None]


def _compare_setting(name: str, params: SamplingParams, rule_name: str, direct: Draws,
                     spec: Draws, before: int, plan: ExactnessPlan, seconds: float,
                     bias_tv: float = 0.0) -> SettingResult:
    rng = np.random.default_rng(plan.seed + 7)
    sa = statistics(direct.samples, plan.positions, before)
    sb = statistics(spec.samples, plan.positions, before)
    comparisons = [compare(sa[k], sb[k], k, rng) for k in sa]
    threshold = plan.alpha / len(comparisons)
    n = max(len(spec.samples), 1)
    return SettingResult(name=name, params=params.as_dict(), rule=rule_name,
                         comparisons=comparisons, threshold=threshold,
                         acceptance_rate=spec.acceptance_rate, seconds=seconds,
                         drafted=spec.drafted,
                         drafted_share=tuple(spec.drafted_at[k] / n for k in plan.positions),
                         detectable=tuple(detectable_tv(c, threshold) for c in comparisons),
                         bias_tv=bias_tv)


def run_exactness(target: Session, drafter: Drafter, prompt: Sequence[int], plan: ExactnessPlan,
                  greedy_prompts: Sequence[Sequence[int]] = (), control: bool = True,
                  tick: Tick | None = None,
                  policy: Callable[[], GammaPolicy] | None = None,
                  widths: Callable[[int], int] | None = None) -> ExactnessReport:
    """Run every setting, then the negative control, then greedy agreement on `greedy_prompts`.
    `policy` makes the gamma policy of each speculative sample (default: fixed gamma); `widths`
    pads the speculative runs' batches as `Pair.generate` does."""
    before = int(prompt[-1])
    report = ExactnessReport(plan=plan, prompt_tokens=len(prompt))

    def ticker(label: str) -> Callable[[], None] | None:
        return (lambda: tick(label)) if tick is not None else None

    control_direct = Draws()
    for k, setting in enumerate(plan.settings):
        t0 = time.perf_counter()
        base = plan.seed * 10_000_000 + k * 1_000_000
        direct = draw(target, None, prompt, setting.params, plan.samples, gamma=0,
                      tokens=plan.tokens, seed=base, tick=ticker(f"{setting.name}: direct"))
        spec = draw(target, drafter, prompt, setting.params, plan.samples, gamma=plan.gamma,
                    tokens=plan.tokens, seed=base + 500_000,
                    tick=ticker(f"{setting.name}: speculative"), policy=policy, widths=widths)
        report.results.append(_compare_setting(setting.name, setting.params, "exact", direct, spec,
                                               before, plan, time.perf_counter() - t0))
        if k == 0:
            control_direct = direct
    if control:
        t0 = time.perf_counter()
        setting = plan.settings[0]
        rule = CalibratedBias(plan.control_tv)
        biased = draw(target, drafter, prompt, setting.params, plan.samples, gamma=plan.gamma,
                      tokens=plan.tokens, seed=plan.seed * 10_000_000 + 9_000_000, rule=rule,
                      tick=ticker("negative control"), policy=policy, widths=widths)
        report.control = _compare_setting(
            f"{setting.name} (biased rule, TV {plan.control_tv:g} per verified round)",
            setting.params, "biased", control_direct, biased, before, plan,
            time.perf_counter() - t0, bias_tv=rule.mean_tv)
    if greedy_prompts:
        report.greedy = greedy_agreement(target, drafter, greedy_prompts, plan.greedy_tokens,
                                         plan.gamma, tick=ticker("greedy agreement"),
                                         widths=widths)
    return report


def total_ticks(plan: ExactnessPlan, n_greedy_prompts: int, control: bool = True) -> int:
    return (2 * len(plan.settings) + int(control)) * plan.samples + n_greedy_prompts
