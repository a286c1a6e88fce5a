"""The negative control's verification rule: the exact rule, except that at a rejection it
emits, with probability `eps`, from p instead of the residual norm(max(0, p - q)). That
over-weights tokens the draft likes. The bias it adds to a round's first emitted token is
exactly eps * TV(p0, q0) * TV(p0, r0) in total variation (a rejection happens with probability
TV(p0, q0), and then moves that much mass), so the rule measures it every round and tunes eps
until the mean over its rounds is `target`: a control of a known size, which the check must
catch. Only the exactness check uses it."""
from __future__ import annotations

import numpy as np

from typing import Sequence

from engine.acceptance import I32, RowsLike, Verdict, greedy_verify, one_hot_verify, residual
from engine.dist import Dist
from engine.rng import Rng


def _tv(a: Dist, b: Dist) -> float:
    return 0.5 * float(np.abs(a.to_dense() - b.to_dense()).sum())


class CalibratedBias:
    def __init__(self, target: float = 0.03) -> None:
        self.target = target
        self.eps = 1.0
        self.rounds = 0
        self._full = 0.0  # sum over rounds of the bias at eps = 1
        self._added = 0.0  # sum over rounds of the bias actually added

    @property
    def mean_tv(self) -> float:
        """The mean bias this control added to a verified round's first token."""
        return self._added / self.rounds if self.rounds else 0.0

    def __call__(self, p: RowsLike, q: Sequence[Dist] | None, draft: I32, rng: Rng,
                 greedy: bool) -> Verdict:
        if greedy:
            return greedy_verify(p, draft)
        if q is None:
            return one_hot_verify(p, draft, rng)
        if len(draft):
            full = _tv(p[0], q[0]) * _tv(p[0], residual(p[0], q[0]))
            self.rounds += 1
            self._full += full
            mean = self._full / self.rounds
            self.eps = min(1.0, self.target / mean) if mean > 0 else 1.0
            self._added += self.eps * full
        for i in range(len(draft)):
            x = int(draft[i])
            px, qx = p[i].prob(x), q[i].prob(x)
            if px >= qx or rng.coin(px / qx):
                continue
            r = p[i] if rng.coin(self.eps) else residual(p[i], q[i])
            return Verdict(i, rng.draw(r), "correction")
        return Verdict(len(draft), rng.draw(p[len(draft)]), "bonus")


def biased_verify(p: RowsLike, q: Sequence[Dist] | None, draft: I32, rng: Rng,
                  greedy: bool) -> Verdict:
    """The uncalibrated control (eps = 1): every rejection resamples from p."""
    return CalibratedBias(target=float("inf"))(p, q, draft, rng, greedy)
