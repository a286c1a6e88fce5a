"""The acceptance estimator: a_j, the chance that drafted position j is accepted given the
earlier ones were, tracked online per drafter (the draft model, and copies from the context)
with decaying counts, so the estimate follows easy and hard stretches of text.

Rounds that draft teach their source's counts. Plain rounds say how predictable the text is too:
the target's top probability at the token it commits tracks the draft's agreement, so each adds a
pseudo-observation `conf_weight * scale * confidence` to the model's counts, where `scale`
(acceptance per unit of confidence) is learned from the rounds that did draft.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.control.constants import ControllerConstants


class Counts:
    """Decayed tries and hits per draft position."""

    def __init__(self, max_gamma: int) -> None:
        self.tries = np.zeros(max_gamma, dtype=np.float64)
        self.hits = np.zeros(max_gamma, dtype=np.float64)

    def learn(self, drafted: int, accepted: int, decay: float) -> None:
        self.tries *= decay
        self.hits *= decay
        # Positions after the first rejection were not tested: a_j is conditional on j-1 passing.
        seen = min(accepted + 1, drafted, len(self.tries))
        self.tries[:seen] += 1.0
        self.hits[:min(accepted, seen)] += 1.0

    def forget(self, decay: float) -> None:
        """A round this source could have drafted but did not: its evidence ages, so the
        estimate drifts back to the prior and the source is tried again."""
        self.tries *= decay
        self.hits *= decay

    def rates(self, prior: float, weight: float, hope: float = 0.0) -> np.ndarray:
        """a_j, shrunk towards the pooled rate where data is thin (the pooled rate towards
        `prior`), with `hope` imagined successes at every position."""
        pooled = (self.hits.sum() + weight * prior) / (self.tries.sum() + weight)
        return (self.hits + weight * pooled + hope) / (self.tries + weight + hope)

    @property
    def empty(self) -> bool:
        return not self.tries.any()


class AcceptanceEstimator:
    def __init__(self, max_gamma: int, k: ControllerConstants) -> None:
        self.constants = k
        self.model = Counts(max_gamma)
        # One set of counts per copying part, by name (prompt lookup, the history); "" for a
        # copy whose part was not named. A part not yet seen reads as empty counts.
        self.copies: dict[str, Counts] = {}
        self._unseen = Counts(max_gamma)
        self.max_gamma = max_gamma
        self.scale_hits = 0.0
        self.scale_conf = 0.0

    @property
    def copy(self) -> Counts:
        """The counts of copies whose part was not named."""
        return self.counts(True)

    def counts(self, copying: bool, source: str = "") -> Counts:
        if not copying:
            return self.model
        return self.copies.get(source, self._unseen)

    def _learning(self, copying: bool, source: str) -> Counts:
        if copying and source not in self.copies:
            self.copies[source] = Counts(self.max_gamma)
        return self.counts(copying, source)

    def acceptance(self, copying: bool, hope: float = 0.0, source: str = "") -> np.ndarray:
        return self.counts(copying, source).rates(self.constants.prior,
                                                  self.constants.prior_weight, hope)

    def expected(self, copying: bool, cap: float = 1.0, hope: float = 0.0,
                 source: str = "") -> np.ndarray:
        """Expected tokens a round commits, E(g) = sum_{i<=g} prod_{j<i} a_j, for g = 0..max,
        each a_j at most `cap` (`hope`: imagined successes per position)."""
        a = np.minimum(self.acceptance(copying, hope, source), cap)
        return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(a))))

    @property
    def scale(self) -> float:
        """Acceptance per unit of target confidence, shrunk towards 1 where data is thin."""
        w = self.constants.scale_prior_weight
        return (self.scale_hits + w) / (self.scale_conf + w)

    def learn(self, drafted: int, accepted: int, copying: bool,
              confidence: Sequence[float] = (), source: str = "") -> None:
        """A round drafted `drafted` tokens and `accepted` of them were kept; `confidence` is
        the target's top probability per row (model rounds teach `scale` with it)."""
        self._learning(copying, source).learn(drafted, accepted, self.constants.decay)
        if copying:
            return
        seen = min(accepted + 1, drafted)
        if len(confidence) < seen:
            return
        self.scale_hits = self.constants.decay * self.scale_hits + min(accepted, seen)
        self.scale_conf = self.constants.decay * self.scale_conf + float(sum(confidence[:seen]))

    def forget(self, source: str) -> None:
        """Copying part `source` could have drafted a round and drafted nothing."""
        if source in self.copies:
            self.copies[source].forget(self.constants.decay)

    def observe_confidence(self, confidence: float, aged: bool = False) -> None:
        """The target's confidence at a token no draft was tested on (a plain round's, or the
        row after a round's last tested one) predicts how a draft would have fared there; it
        counts as a fraction of an observation at every position. `aged`: the round already
        aged the counts."""
        a = min(self.scale * confidence, 1.0)
        m, w = self.model, self.constants.conf_weight
        if not aged:
            m.tries *= self.constants.decay
            m.hits *= self.constants.decay
        m.tries += w
        m.hits += w * a
