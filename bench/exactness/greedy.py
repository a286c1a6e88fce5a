"""Greedy agreement: how often speculative greedy decoding reproduces plain greedy decoding, and
the one rule for comparing two greedy outputs of a real model.

In exact arithmetic the two are identical. The target scores a drafted batch in one decode and
plain decoding one token at a time, and llama.cpp's logits differ between the two by up to
`BATCH_LOGIT_DRIFT` (docs/EXACTNESS.md, "Numerics"), so two greedy outputs may part where the
target's two candidates are closer than twice that, and nowhere else. `near_tie_divergence`
finds the first difference and the target's logit gap between the two tokens there, on the
one-token path; `check_near_tie` fails on a gap the numerics cannot explain. Plain string
equality is never the test: another CPU's numerics flip other near-ties.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engine.drafters.base import Drafter
from engine.events import DoneEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.sampling import SamplingParams
from engine.session import Session


# The largest logit difference measured between a batch decode and one-token decodes of the same
# positions (the embedded 1.5B Q4_K_M target, bench/research/row_drift.py, docs/EXACTNESS.md).
BATCH_LOGIT_DRIFT = 0.705
# Two tokens can swap places between those two paths only if their logits are closer than this.
NEAR_TIE_GAP = 2 * BATCH_LOGIT_DRIFT


class GreedyMismatch(AssertionError):
    """Two greedy outputs part where the target is not near a tie: not numerics, a bug."""


@dataclass(frozen=True)
class Divergence:
    position: int | None  # the first differing token's index; None: identical outputs
    gap: float = 0.0  # the target's logit gap between the two tokens there (one-token path)
    top_two_gap: float = 0.0  # and between its own top two there

    def describe(self) -> str:
        if self.position is None:
            return "identical"
        return (f"first difference at token {self.position}: the target's logits of the two "
                f"tokens are {self.gap:.3f} apart (its top two {self.top_two_gap:.3f}); "
                f"numerics can explain under {NEAR_TIE_GAP:.3f}")


def near_tie_divergence(target: Session, prompt: Sequence[int], a: Sequence[int],
                        b: Sequence[int]) -> Divergence:
    """Where greedy outputs `a` and `b` (token ids after `prompt`) first differ, with the
    target's logit gap between the two tokens there, decoded one token at a time along the
    common prefix as plain decoding does. An output that is a prefix of the other agrees (a
    length limit cut it, or it ended where the other went on: compare runs of equal length)."""
    at = first_divergence(a, b)
    if at is None or at >= min(len(a), len(b)):
        return Divergence(None)
    # As plain decoding ran: the prompt but its last token in one batch, then one token a decode.
    target.sync(prompt, feed_last=False)
    for t in [prompt[-1], *a[:at]]:
        row = target.extend([int(t)])[0]
    second, best = np.argsort(row)[-2:]
    return Divergence(at, abs(float(row[int(a[at])] - row[int(b[at])])),
                      float(row[best] - row[second]))


def text_divergence(target: Session, prompt: Sequence[int], a: str, b: str) -> Divergence:
    """`near_tie_divergence` for two answers known only as text (an API's): follow the target's
    own one-token greedy path until its text leaves either answer; that token's index and the
    target's top-two gap there. Any of the three paths may part only at a near-tie."""
    if a == b:
        return Divergence(None)
    answers = (a.encode(), b.encode())
    target.sync(prompt, feed_last=False)
    row = target.extend([int(prompt[-1])])[0]
    text = b""
    for i in range(max(map(len, answers))):
        second, best = np.argsort(row)[-2:]
        text += target.backend.token_bytes(int(best))
        if not all(answer.startswith(text) for answer in answers):
            gap = float(row[best] - row[second])
            return Divergence(i, gap, gap)
        row = target.extend([int(best)])[0]
    raise AssertionError("the one-token path never left the two answers")


def require_near_tie(d: Divergence, bound: float = NEAR_TIE_GAP) -> Divergence:
    """Print `d` (pytest shows it with the test) and raise GreedyMismatch when the outputs part
    at a gap of `bound` or more."""
    print(f"greedy comparison: {d.describe()}")
    if d.position is not None and d.gap >= bound:
        raise GreedyMismatch(d.describe())
    return d


def check_near_tie(target: Session, prompt: Sequence[int], a: Sequence[int], b: Sequence[int],
                   bound: float = NEAR_TIE_GAP) -> Divergence:
    """Two greedy token outputs agree up to a near-tie, or GreedyMismatch."""
    return require_near_tie(near_tie_divergence(target, prompt, a, b), bound)


@dataclass(frozen=True)
class GreedyCase:
    prompt: int
    plain_tokens: int
    speculative_tokens: int
    first_divergence: int | None  # None: identical outputs
    # The target's logit gap between the two tokens there (one-token path): under
    # NEAR_TIE_GAP it is batch numerics, at or over it a bug.
    gap: float | None = None

    @property
    def near_tie(self) -> bool:
        return self.gap is None or self.gap < NEAR_TIE_GAP


@dataclass(frozen=True)
class GreedyAgreement:
    cases: list[GreedyCase]

    @property
    def identical(self) -> int:
        return sum(c.first_divergence is None for c in self.cases)

    @property
    def unexplained(self) -> int:
        """Cases that part where the target is not near a tie."""
        return sum(not c.near_tie for c in self.cases)

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
        d = near_tie_divergence(target, prompt, plain, spec)
        cases.append(GreedyCase(i, len(plain), len(spec), first_divergence(plain, spec),
                                d.gap if d.position is not None else None))
        if tick is not None:
            tick()
    return GreedyAgreement(cases)
