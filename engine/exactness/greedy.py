"""Greedy agreement: how often speculative greedy decoding reproduces plain greedy decoding.

In exact arithmetic the two are identical. The target scores a drafted batch in one decode and
plain decoding one token at a time, and llama.cpp's logits differ slightly between the two, so
near-ties can flip; the first-divergence positions show where that happened.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from engine.drafters.base import Drafter
from engine.events import DoneEvent
from engine.generator import GenerationConfig, generate
from engine.sampling import SamplingParams
from engine.session import Session


@dataclass(frozen=True)
class GreedyCase:
    prompt: int
    plain_tokens: int
    speculative_tokens: int
    first_divergence: int | None  # None: identical outputs


@dataclass(frozen=True)
class GreedyAgreement:
    cases: list[GreedyCase]

    @property
    def identical(self) -> int:
        return sum(c.first_divergence is None for c in self.cases)

    @property
    def rate(self) -> float:
        return self.identical / len(self.cases) if self.cases else float("nan")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _tokens(target: Session, drafter: Drafter | None, prompt: Sequence[int],
            config: GenerationConfig,
            widths: Callable[[int], int] | None = None) -> tuple[int, ...]:
    done = None
    for ev in generate(target, drafter, prompt, config, widths=widths):
        if isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    return done.tokens


def greedy_agreement(target: Session, drafter: Drafter, prompts: Sequence[Sequence[int]],
                     max_tokens: int, gamma: int,
                     tick: Callable[[], None] | None = None,
                     widths: Callable[[int], int] | None = None) -> GreedyAgreement:
    greedy = SamplingParams(temperature=0.0)
    cases = []
    for i, prompt in enumerate(prompts):
        plain = _tokens(target, None, prompt, GenerationConfig(params=greedy, gamma=0,
                                                               max_tokens=max_tokens))
        spec = _tokens(target, drafter, prompt, GenerationConfig(params=greedy, gamma=gamma,
                                                                 max_tokens=max_tokens), widths)
        cases.append(GreedyCase(i, len(plain), len(spec), first_divergence(plain, spec)))
        if tick is not None:
            tick()
    return GreedyAgreement(cases)
