"""The exact law of a generation's output, by enumerating every random choice it makes.

Every random choice of the engine goes through `Rng.draw` and `Rng.coin`. `EnumeratingRng`
replays a path of choices and takes the first option past its end, recording every option with
its probability; `exact_law` runs the generation once per leaf of that tree (depth first) and
sums each leaf's probability onto its output. No sampling, so no noise: a law computed this way
is exact up to float rounding, and an inexact rule shows as a total variation far above it.

The generation must be deterministic given its choices: fresh sessions, drafters and policies
per run, and a virtual clock (`VirtualClock`) instead of wall time.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Hashable, Sequence

import numpy as np

from engine.dist import Dist
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import probabilities
from tests.fakes import FakeBackend


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


class VirtualClock:
    """Milliseconds that pass only when a costed fake decodes: a deterministic stand-in for
    wall time, and a cost profile (TableFake's `cost`) when the costs are chosen to match one."""

    def __init__(self) -> None:
        self.ms = 0.0

    def now(self) -> float:
        return self.ms


class TableFake(FakeBackend):
    """A tiny-vocabulary fake whose logits are a table lookup on the last two tokens (fast to
    run thousands of times), optionally rounded to a grid so rows hold exact ties, with token
    `eog` ending the generation and each decode of w tokens costing `cost[w - 1]` virtual ms.
    `keep_ids` leaves only those tokens finite (a draft with a trimmed output vocabulary)."""

    def __init__(self, n_vocab: int = 8, seed: int = 0, scale: float = 2.5, noise: float = 0.0,
                 grid: float = 0.0, eog: int | None = None, clock: VirtualClock | None = None,
                 cost: Sequence[float] = (1.0,), keep_ids: Sequence[int] | None = None) -> None:
        super().__init__(n_vocab=n_vocab, seed=seed, scale=scale, eog=eog, order=2)
        rng = np.random.default_rng(seed)
        table = rng.standard_normal((n_vocab, n_vocab, n_vocab)) * scale
        if noise:
            table = table + np.random.default_rng(seed + 1000).standard_normal(table.shape) * noise
        if grid:
            table = np.round(table / grid) * grid
        if eog is not None:
            table[..., eog] -= 1.5
        if keep_ids is not None:
            mask = np.full(n_vocab, -np.inf)
            mask[list(keep_ids)] = 0.0
            table = table + mask
        self.table = table.astype(np.float32)
        self.clock = clock
        self.cost = list(cost)

    def _row(self, context: Sequence[int]) -> np.ndarray:
        a = context[-2] if len(context) > 1 else 0
        return self.table[a, context[-1]]

    def decode(self, tokens: Sequence[int], pos: int, rows: Sequence[int]) -> np.ndarray:
        if self.clock is not None:
            w = len(tokens)
            c = self.cost
            self.clock.ms += c[w - 1] if w <= len(c) else c[-1] * w / len(c)
        return super().decode(tokens, pos, rows)
