"""The engine's one source of randomness, with the draws the acceptance rule's residuals need."""
from __future__ import annotations

from typing import Callable

import numpy as np

from engine.dist import Dist


class Rng:
    """The engine's one source of randomness. Every random choice of a generation goes through
    its methods (a token from a distribution, `draw`; a biased coin, `coin`, or one known only
    within bounds, `coin_bounded`; a token from the acceptance rule's residuals,
    `draw_residual` and `draw_without`), so a test can substitute a subclass that branches on
    every outcome with its exact probability and computes the exact law of the output
    (tests/exact_law.py). Here they draw uniforms; their laws are those exact ones."""

    # Rejection tries for a residual before it is formed explicitly (either way its law is the
    # residual's; the tries are cheaper while p and q differ enough to end them quickly).
    RESIDUAL_TRIES = 8

    def __init__(self, seed: int | None = None) -> None:
        self._gen = np.random.default_rng(seed)

    def random(self) -> float:
        return float(self._gen.random())

    def draw(self, dist: Dist) -> int:
        """One token id from `dist`."""
        return dist.sample(self.random)

    def coin(self, p: float) -> bool:
        """True with probability `p`."""
        return self.random() < p

    def coin_bounded(self, lo: float, hi: float, exact: Callable[[], float]) -> bool:
        """True with probability `exact()`, known to lie in [lo, hi]: `exact` is called only
        when the uniform falls between the bounds."""
        u = self.random()
        if u < lo:
            return True
        if u >= hi:
            return False
        return u < exact()

    def draw_residual(self, p: Dist, q: Dist) -> int:
        """A token from norm(max(0, p - q)): y from p kept with probability max(0, 1 - q(y)/p(y))
        (a kept y has probability proportional to max(0, p(y) - q(y))), a few tries, then from
        the residual formed explicitly."""
        for _ in range(self.RESIDUAL_TRIES):
            y = self.draw(p)
            p_lo, p_hi = p.prob_bounds(y)
            q_lo, q_hi = q.prob_bounds(y)
            if self.coin_bounded(max(0.0, 1.0 - q_hi / p_lo), max(0.0, 1.0 - q_lo / p_hi),
                                 lambda: max(0.0, 1.0 - q.prob(y) / p.prob(y))):
                return y
        return self.draw(p.residual(q))

    def draw_without(self, p: Dist, x: int) -> int:
        """A token from p with x removed: draws from p until one is not x, a few tries, then from
        the row without x formed explicitly."""
        for _ in range(self.RESIDUAL_TRIES):
            y = self.draw(p)
            if y != x:
                return y
        return self.draw(p.without(x))
