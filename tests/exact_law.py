"""The exact law of a generation's output, by enumerating every random choice it makes.

Every random choice of the engine goes through `Rng.draw` and `Rng.coin`. `EnumeratingRng`
replays a path of choices and takes the first option past its end, recording every option with
its probability; `exact_law` runs the generation once per leaf of that tree (depth first) and
sums each leaf's probability onto its output. No sampling, so no noise: a law computed this way
is exact up to float rounding, and an inexact rule shows as a total variation far above it.

The generation must be deterministic given its choices: fresh sessions, drafters and policies
per run, and a virtual clock (bench/fakes/table.py's `VirtualClock`) instead of wall time.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Hashable, Sequence

import numpy as np

from engine.dist import Dist
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import probabilities
from bench.fakes.backend import FakeBackend


class EnumeratingRng(Rng):
    def __init__(self, path: Sequence[int]) -> None:
        super().__init__(0)
        self.path = list(path)
        self.taken: list[int] = []
        self.sizes: list[int] = []
        self.prob = 1.0

    def _choose(self, options: list[tuple[object, float]]) -> object:
        depth = len(self.taken)
        k = self.path[depth] if depth < len(self.path) else 0
        self.taken.append(k)
        self.sizes.append(len(options))
        value, prob = options[k]
        self.prob *= prob
        return value

    def random(self) -> float:
        raise AssertionError("a random choice bypassed Rng.draw / Rng.coin")

    def draw(self, dist: Dist) -> int:
        ids, probs = dist.support()
        return int(self._choose([(int(i), float(w)) for i, w in zip(ids, probs)]))

    def coin(self, p: float) -> bool:
        p = min(1.0, float(p))
        options = [(v, w) for v, w in ((True, p), (False, 1.0 - p)) if w > 0]
        return bool(self._choose(options))

    # The engine's shortcuts have these exact laws (tests/test_dist.py checks them by Monte
    # Carlo): enumerate the laws.
    def coin_bounded(self, lo: float, hi: float, exact) -> bool:
        return self.coin(exact())

    def draw_residual(self, p: Dist, q: Dist) -> int:
        return self.draw(p.residual(q))

    def draw_without(self, p: Dist, x: int) -> int:
        return self.draw(p.without(x))


def exact_law(run: Callable[[Rng], Hashable], max_leaves: int = 2_000_000) -> dict:
    """{output: probability} of `run(rng)` over every sequence of choices it can make."""
    law: dict = defaultdict(float)
    stack: list[list[int]] = [[]]
    leaves = 0
    while stack:
        path = stack.pop()
        rng = EnumeratingRng(path)
        law[run(rng)] += rng.prob
        leaves += 1
        if leaves > max_leaves:
            raise AssertionError(f"more than {max_leaves} leaves: shrink the case")
        for depth in range(len(path), len(rng.sizes)):
            for alt in range(1, rng.sizes[depth]):
                stack.append(rng.taken[:depth] + [alt])
    return dict(law)


def target_law(backend: FakeBackend, prompt: Sequence[int], params: SamplingParams,
               n: int) -> dict:
    """The law of the first `n` tokens of plain sampling from `backend` under `params`,
    computed from its rows directly (an end-of-generation token ends the output unseen)."""
    law: dict = {}

    def walk(out: tuple[int, ...], prob: float) -> None:
        if len(out) == n:
            law[out] = law.get(out, 0.0) + prob
            return
        p = probabilities(backend._row(list(prompt) + list(out)), params)
        for x in np.flatnonzero(p > 0):
            if backend.is_eog(int(x)):
                law[out] = law.get(out, 0.0) + prob * float(p[x])
            else:
                walk(out + (int(x),), prob * float(p[x]))

    walk((), 1.0)
    return law


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
