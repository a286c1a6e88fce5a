"""The benchmark runner: every prompt x sampling setting is one group holding a baseline run
(same target, same sampling, drafter "plain") and one run per speculative configuration.

Fairness: every run starts from empty KV caches (so prefill and TTFT are measured, not reused
from the previous run); the order inside a group alternates between baseline-first and
baseline-last so that machine drift and warm CPU caches do not favour one side; a warm-up
generation per drafter runs before the first measured run and is not recorded.

Constraints: a prompt that carries a grammar (a suite line's `schema`) runs every one of its
runs under it, the baseline too: the baseline is then plain *constrained* decoding (the target
decodes every token, forced or not), the measure speculation under a grammar is compared with.

Repeats: with `repeats` > 1 each group runs that many times in a row (alternating the order
again). A one-second run on a shared machine is noisy (a `plain` configuration's A/A runs show
how much), so the first repetition's records carry the speedup of the medians: median decode
tokens/s of the configuration over median tokens/s of the baseline. The later repetitions are kept in the raw
data with role "baseline-repeat" / "speculative-repeat" and do not count twice in the
aggregates.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from bench.benchmark.records import RunRecord, pair_with_median, record_from_stats
from bench.benchmark.suite import SuitePrompt
from engine.drafters.base import PLAIN, plain_alias
from engine.drafters.history_index import HistoryIndex
from engine.errors import GrammarError, SettingsError
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.control.registry import POLICIES
from engine.sampling import SamplingParams


# How a configuration that drafts from a history is spelled: DRAFTER+history.
HISTORY_MARK = "+history"
# A benchmark's histories hold every prompt and answer of the run.
HISTORY_CAP = 50_000_000


@dataclass(frozen=True)
class SpecConfig:
    """One speculative configuration: a drafter, a gamma and a gamma policy; `opening` sets the
    adaptive controller's plain opening tokens (None: its default); `history`: the drafter
    drafts from a history of the run's earlier prompts and answers (its own, empty at the
    start, grown in prompt order; spelled DRAFTER+history)."""

    drafter: str
    gamma: int
    policy: str = "fixed"
    opening: int | None = None
    history: bool = False

    def __post_init__(self) -> None:
        if self.opening is not None and self.policy != "adaptive":
            raise SettingsError(f"{self.label}: plain opening tokens are a setting of the "
                                "adaptive policy only")
        if self.opening is not None and self.opening < 0:
            raise SettingsError(f"{self.label}: plain opening tokens must be >= 0")

    @property
    def item(self) -> str:
        """The config as `tandem bench --configs` spells it."""
        tail = f":{self.opening}" if self.opening is not None else ""
        return f"{self.drafter}{HISTORY_MARK if self.history else ''}:{self.policy}:{self.gamma}{tail}"

    @property
    def label(self) -> str:
        tail = "" if self.policy == "fixed" else f" {self.policy}"
        if self.opening is not None:
            tail += f" open={self.opening}"
        return f"{self.drafter}{HISTORY_MARK if self.history else ''} g={self.gamma}{tail}"


@dataclass(frozen=True)
class BenchPlan:
    prompts: Sequence[SuitePrompt]
    configs: Sequence[SpecConfig]
    samplings: Sequence[SamplingParams]
    max_tokens: int = 64
    seed: int = 0
    warmup_tokens: int = 8
    repeats: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise SettingsError(f"repeats must be >= 1, got {self.repeats}")
        if not self.prompts:
            raise SettingsError("the benchmark has no prompts")
        if not self.configs:
            raise SettingsError("the benchmark needs at least one speculative configuration")
        if not self.samplings:
            raise SettingsError("the benchmark needs at least one sampling setting")
        for c in self.configs:
            if plain_alias(c.drafter) == PLAIN or c.gamma < 1:
                raise SettingsError(f"a speculative configuration needs a drafter and gamma >= 1, "
                                    f"got {c.label}")

    @property
    def total_runs(self) -> int:
        return len(self.prompts) * len(self.samplings) * (1 + len(self.configs)) * self.repeats


Progress = Callable[[int, int, RunRecord], None]


def cold_start(pair: Pair) -> None:
    """Empty every KV cache the pair's drafters and target hold, and reset drafter state."""
    pair.target.rollback(0)
    for name in pair.drafters:
        drafter = pair.drafter(name)
        if drafter is None:
            continue
        drafter.reset()


def _one(pair: Pair, prompt: SuitePrompt, params: SamplingParams, config: SpecConfig | None,
         max_tokens: int, order: int, history: HistoryIndex | None = None) -> RunRecord:
    # Calibration first (the adaptive policy reads it, and every speculative run pads its
    # batches by it): it touches the caches.
    if config:
        pair.calibration(config.drafter, config.gamma)
    policy = (pair.make_policy(config.policy, config.drafter, config.gamma, config.opening)
              if config else None)
    grammar = pair.compile_grammar(prompt.grammar) if prompt.grammar is not None else None
    cold_start(pair)
    gen = GenerationConfig(params=params, gamma=config.gamma if config else 0,
                           max_tokens=max_tokens, grammar=grammar)
    done = None
    for ev in pair.generate(prompt.prompt, gen, drafter=config.drafter if config else PLAIN,
                            policy=policy, history=history):
        if isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    record = record_from_stats(done.stats, order=order, prompt_id=prompt.id,
                               category=prompt.category,
                               config=config.label if config else "baseline",
                               policy=config.policy if config else PLAIN, params=params)
    if config is not None and config.history:
        # Its own line in the gamma sweep, apart from the same drafter without a history.
        record.drafter += HISTORY_MARK
    return record


def warm_up(pair: Pair, plan: BenchPlan) -> None:
    """One short unrecorded run of the baseline and of each drafter (loads pages, JIT paths)."""
    prompt, params = plan.prompts[0], plan.samplings[0]
    seen: set[str] = set()
    _one(pair, prompt, params, None, plan.warmup_tokens, -1)
    for c in plan.configs:
        if c.drafter not in seen:
            seen.add(c.drafter)
            _one(pair, prompt, params, c, plan.warmup_tokens, -1)


def validate(pair: Pair, plan: BenchPlan) -> None:
    """Fail before any run when a drafter or policy name is unknown, or when the target's
    vocabulary cannot follow a prompt's constraint."""
    for c in plan.configs:
        pair.drafter(c.drafter)
        if c.policy not in POLICIES:
            raise SettingsError(f"unknown gamma policy {c.policy!r}; choose one of {', '.join(POLICIES)}")
    for prompt in plan.prompts:
        if prompt.grammar is not None:
            try:
                pair.compile_grammar(prompt.grammar)
            except GrammarError as e:
                raise SettingsError(f"prompt {prompt.id}: {e}") from None


def run_benchmark(pair: Pair, plan: BenchPlan, progress: Progress | None = None) -> list[RunRecord]:
    """Run the plan; returns every measured run, speculative runs paired with their baseline."""
    validate(pair, plan)
    if plan.warmup_tokens > 0:
        warm_up(pair, plan)
    records: list[RunRecord] = []
    total = plan.total_runs
    group = 0
    # Each history configuration's own history of the prompts so far (their first runs').
    histories = {c: HistoryIndex() for c in plan.configs if c.history}
    for i, prompt in enumerate(plan.prompts):
        for j, sampling in enumerate(plan.samplings):
            params = replace(sampling, seed=None if sampling.greedy
                             else plan.seed * 1_000_003 + i * 101 + j)
            by_config: dict[SpecConfig | None, list[RunRecord]] = {}
            grown: dict[SpecConfig, HistoryIndex] = {}
            for _ in range(plan.repeats):
                runs: list[SpecConfig | None] = [None, *plan.configs]
                if group % 2:
                    runs = [*plan.configs, None]
                group += 1
                for config in runs:
                    # Every repetition drafts from the history as it was before this prompt
                    # (a repetition is not a regeneration); the first one's answer is kept.
                    history = None
                    if config is not None and config.history:
                        history = HistoryIndex.restore(histories[config].state(), HISTORY_CAP)
                        grown.setdefault(config, history)
                    rec = _one(pair, prompt, params, config, plan.max_tokens, len(records),
                               history)
                    records.append(rec)
                    by_config.setdefault(config, []).append(rec)
                    if progress is not None:
                        progress(len(records), total, rec)
            histories.update(grown)
            baselines = by_config.pop(None)
            for rec in baselines[1:]:
                rec.role = "baseline-repeat"
            for runs_of_config in by_config.values():
                pair_with_median(runs_of_config, baselines)
                for rec in runs_of_config[1:]:
                    rec.role = "speculative-repeat"
    return records
