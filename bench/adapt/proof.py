"""The proof before an adapted draft is used: base and adapted draft against the target on
held-out prompts (none trained on), greedy and at T 0.7, in one table.

Both drafts are teacher-forced on the target's own answers (one batch decode per answer and
model), which gives what a speculative round would accept exactly, without running one:

- greedy: a drafted token is accepted where it is the target's argmax, so over a round of `gamma`
  started at every position of a greedy answer, position j accepts where positions 1..j all
  match; "acceptance per position" is the share accepted at j of those that reached j;
- T 0.7: a drafted token is accepted with probability sum_x min(p(x), q(x)) (the rejection rule),
  along a sampled answer of the target's; position j's acceptance is that expectation weighted by
  the chance of reaching j.

Accepted tokens per target call is one more than a round's expected accepted drafts. The speed
predicted on the measured GPU profile (bench/benchmark/gpu_profile.py: a round of `gamma` costs
a verify of gamma + 1 tokens over one, plus gamma drafted tokens at the draft's measured cost) is
relative to plain decoding; the speed measured on this CPU is the generator's own, on a few
held-out prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from bench.adapt.data import Example
from bench.benchmark.gpu_profile import measured
from engine.backend import Backend

GAMMA = 4
TEMPERATURES = (0.0, 0.7)


def _probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def rows(backend: Backend, e: Example) -> np.ndarray:
    """Logits of `backend` at every answer position of `e`, teacher-forced."""
    toks = e.tokens
    backend.truncate(0)
    return backend.decode(toks, 0, list(range(len(e.prompt) - 1, len(toks) - 1)))


def accept_chances(target_rows: np.ndarray, draft_rows: np.ndarray, e: Example) -> np.ndarray:
    """Per answer position, the chance the draft's token is accepted: greedy, 1 where the
    draft's argmax is the target's token; sampled, sum_x min(p(x), q(x))."""
    if e.temperature == 0:
        return (np.argmax(draft_rows, axis=1) == np.asarray(e.answer)).astype(np.float64)
    p, q = _probs(target_rows, e.temperature), _probs(draft_rows, e.temperature)
    return np.minimum(p, q).sum(axis=1)


@dataclass
class Rounds:
    """Rounds of `gamma` started at every position, pooled over answers."""
    gamma: int = GAMMA
    reached: np.ndarray = field(default_factory=lambda: np.zeros(GAMMA))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(GAMMA))
    rounds: int = 0

    def add(self, chances: np.ndarray) -> None:
        for i in range(len(chances)):
            reach = 1.0
            for j in range(min(self.gamma, len(chances) - i)):
                self.reached[j] += reach
                reach *= chances[i + j]
                self.accepted[j] += reach
            self.rounds += 1

    @property
    def per_position(self) -> np.ndarray:
        return self.accepted / np.maximum(self.reached, 1e-12)

    @property
    def mean_acceptance(self) -> float:
        """The mean of acceptance per position (the done-when figure)."""
        return float(self.per_position.mean())

    @property
    def tokens_per_call(self) -> float:
        return 1.0 + float(self.accepted.sum()) / max(self.rounds, 1)

    def gpu_speedup(self) -> float:
        """Predicted tokens/s against plain decoding on the measured GPU profile."""
        gpu = measured()
        cost = gpu.ratio(self.gamma + 1) + gpu.draft_cost * self.gamma
        return self.tokens_per_call / cost


# Rounds by (draft name, category, temperature): one per held-out answer, in the order of the
# answers, so that the drafts' lists pair up prompt by prompt.
Measured = dict[tuple[str, str, float], list[Rounds]]


def measure(target: Backend, drafts: Mapping[str, Backend], held_out: Sequence[Example]
            ) -> Measured:
    """Rounds of each answer by (draft name, category, temperature), teacher-forced on
    `held_out`."""
    out: Measured = {}
    for e in held_out:
        t_rows = rows(target, e)
        for name, d in drafts.items():
            r = Rounds()
            r.add(accept_chances(t_rows, rows(d, e), e))
            out.setdefault((name, e.category, e.temperature), []).append(r)
    return out


def total(rounds: Sequence[Rounds]) -> Rounds:
    """Rounds pooled over answers (of one gamma)."""
    g = rounds[0].gamma if rounds else GAMMA
    out = Rounds(gamma=g, reached=np.zeros(g), accepted=np.zeros(g))
    for r in rounds:
        out.reached += r.reached
        out.accepted += r.accepted
        out.rounds += r.rounds
    return out


def pooled(results: Measured, name: str, categories: Sequence[str], temperature: float
           ) -> Rounds:
    return total([r for (n, cat, temp), rs in results.items()
                  if n == name and cat in categories and temp == temperature for r in rs])


def greedy_rounds(draft: Backend, examples: Sequence[Example]) -> Rounds:
    """Greedy rounds of `draft` on `examples`: a drafted token is accepted where it is the
    target's argmax (each example's labels), so no target decode is needed."""
    out = Rounds()
    for e in examples:
        out.add((np.argmax(rows(draft, e), axis=1) == np.asarray(e.labels)).astype(np.float64))
    return out


def agreement(draft: Backend, examples: Sequence[Example]) -> float:
    """The share of answer positions where `draft`'s argmax, in the example's own context, is
    the target's (its label): the in-context figure the trainer's own accuracy is set beside."""
    hits = n = 0
    for e in examples:
        got = np.argmax(rows(draft, e), axis=1) == np.asarray(e.labels)
        hits, n = hits + int(got.sum()), n + len(got)
    return hits / n if n else float("nan")
