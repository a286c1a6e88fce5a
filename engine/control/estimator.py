"""The acceptance estimator: a_j, the chance that drafted position j is accepted given the
earlier ones were, tracked online per acceptance key (the draft model; a copy source at a match
length's bucket, engine/round_plan.py) with decaying counts, so the estimate follows easy and
hard stretches of text; and, undecayed, each key's rounds and first-position acceptance over its
whole life, which the exploration rule and the reason line read (engine/control/controller.py).

Rounds that draft teach their key's counts. Plain rounds say how predictable the text is too:
the target's top probability at the token it commits tracks the draft's agreement, so each adds a
pseudo-observation `conf_weight * scale * confidence` to the model's counts, where `scale`
(acceptance per unit of confidence) is learned from the rounds that did draft.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from engine.control.constants import ControllerConstants
from engine.round_plan import MODEL, shorter_keys
from engine.generation_config import COPY_MAX, MAX_GAMMA

# Positions counted per key: as far as the longest round drafts (a copy's, COPY_MAX).
POSITIONS = max(COPY_MAX, MAX_GAMMA)

# What `ceiling` adds for the rounding of forgetting: a key forgotten a million times moves its
# hit rates by about 1e-10.
CEILING_SLACK = 1e-6


class Counts:
    """Decayed tries and hits per draft position, and the undecayed tally of rounds and of
    first-position hits."""

    def __init__(self, positions: int = POSITIONS) -> None:
        self.tries = np.zeros(positions, dtype=np.float64)
        self.hits = np.zeros(positions, dtype=np.float64)
        self.rounds = 0
        self.first_hits = 0
        # Bumped by every change, so a prediction made from these counts can be kept until then.
        self.version = 0

    def learn(self, drafted: int, accepted: int, decay: float, start: int = 0,
              done: bool = True) -> None:
        """One round of `drafted` tokens kept `accepted`. A round judged as it goes (a watched
        copy, engine/control/controller.py) is learned in parts: `start` positions of it were
        counted already (and aged the counts), and `done` False leaves the round open, so the
        parts together count each tested position once, as the whole round would.

        >>> c = Counts(8)
        >>> c.learn(3, 3, 0.5, done=False); c.learn(6, 3, 0.5, start=3)
        >>> c.tries[:6].tolist(), c.hits[:6].tolist(), c.rounds
        ([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], 1)
        """
        if start == 0:
            self.tries *= decay
            self.hits *= decay
        # Positions after the first rejection were not tested: a_j is conditional on j-1 passing.
        seen = min(accepted + 1, drafted, len(self.tries))
        self.tries[start:seen] += 1.0
        self.hits[start:min(accepted, seen)] += 1.0
        if done:
            self.rounds += 1
            self.first_hits += accepted > 0
        self.version += 1

    def forget(self, decay: float) -> None:
        """A round this key could have drafted but did not: its evidence ages, so the
        estimate drifts back to the prior."""
        self.tries *= decay
        self.hits *= decay
        self.version += 1

    def rates(self, prior: float, weight: float, hope: float = 0.0) -> np.ndarray:
        """a_j, shrunk towards the pooled rate where data is thin (the pooled rate towards
        `prior`), with `hope` imagined successes at every position."""
        pooled = (self.hits.sum() + weight * prior) / (self.tries.sum() + weight)
        return (self.hits + weight * pooled + hope) / (self.tries + weight + hope)

    @property
    def empty(self) -> bool:
        return not self.tries.any()

    def as_dict(self) -> dict:
        return {"tries": self.tries.tolist(), "hits": self.hits.tolist(), "rounds": self.rounds,
                "first_hits": self.first_hits}

    @classmethod
    def from_dict(cls, d: dict) -> "Counts":
        c = cls(max(len(d["tries"]), POSITIONS))
        tries = np.asarray(d["tries"], dtype=np.float64)
        hits = np.asarray(d["hits"], dtype=np.float64)
        if tries.shape != hits.shape or tries.ndim != 1:
            raise ValueError("counts of different shapes")
        # Counts kept before copies drafted 64 tokens hold fewer positions: the rest are untried.
        c.tries[:len(tries)], c.hits[:len(hits)] = tries, hits
        c.rounds, c.first_hits = int(d["rounds"]), int(d["first_hits"])
        return c


class AcceptanceEstimator:
    def __init__(self, k: ControllerConstants) -> None:
        self.constants = k
        # One set of counts per acceptance key (`RoundPlan.acceptance_key`); a key not yet
        # seen reads as empty counts.
        self.keys: dict[str, Counts] = {MODEL: Counts()}
        self._unseen = Counts()
        self.scale_hits = 0.0
        self.scale_conf = 0.0
        # The last `expected` answer, with what it was computed from.
        self._memo: tuple[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._top_memo: tuple[tuple, float] | None = None

    @property
    def model(self) -> Counts:
        return self.keys[MODEL]

    def counts(self, key: str) -> Counts:
        return self.keys.get(key, self._unseen)

    def _learning(self, key: str) -> Counts:
        if key not in self.keys:
            self.keys[key] = Counts()
        return self.keys[key]

    def prior(self, key: str) -> float:
        """The acceptance `key` is shrunk towards where its own counts are thin: `prior`, or for
        a copy at a match length the pooled rate of a shorter match of the same source when
        that is higher. A longer match is no worse a bet than a shorter one, so a copying answer
        whose copies were kept at 3-token matches does not start again from `prior` at each
        longer match it reaches (each would be watched for up to 64 plain tokens before it
        drafted: a whole verbatim stretch of a fresh process's first answer)."""
        k = self.constants
        best = k.prior
        for shorter in shorter_keys(key):
            counts = self.keys.get(shorter)
            if counts is not None:
                tried = float(counts.tries.sum())
                if tried > 0:
                    best = max(best, (float(counts.hits.sum()) + k.prior_weight * k.prior)
                               / (tried + k.prior_weight))
        return best

    def expected(self, key: str, n: int, cap: float = 1.0,
                 hope: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a_j for j < n, E(g), E(g) with `hope` imagined successes per position) for
        g = 0..n: E(g) = sum_{i<=g} prod_{j<i} a_j, each a_j at most `cap`."""
        k = self.constants
        counts = self.counts(key)
        prior = self.prior(key)
        memo_key = (key, id(counts), counts.version, n, cap, hope, prior, k.prior_weight)
        if self._memo is not None and self._memo[0] == memo_key:
            return self._memo[1]
        tries, hits = counts.tries[:n], counts.hits[:n]
        a, pooled = self._rates(counts, n, prior)
        hopeful = (hits + k.prior_weight * pooled + hope) / (tries + k.prior_weight + hope)
        result = (a, np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(np.minimum(a, cap))))),
                  np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(np.minimum(hopeful, cap))))))
        self._memo = (memo_key, result)
        return result

    def top(self, key: str, n: int) -> float:
        """The largest a_j (j < n) of `expected(key, n)`, uncapped and without hope, computed
        alike (so equal to it) without the E(g) sums; kept until the key's counts change."""
        k = self.constants
        counts = self.counts(key)
        prior = self.prior(key)
        memo_key = (key, id(counts), counts.version, n, prior, k.prior_weight)
        if self._top_memo is not None and self._top_memo[0] == memo_key:
            return self._top_memo[1]
        top = float(self._rates(counts, n, prior)[0].max())
        self._top_memo = (memo_key, top)
        return top

    def _rates(self, counts: Counts, n: int, prior: float) -> tuple[np.ndarray, float]:
        """(a_j for j < n, the pooled rate they shrink towards): each position's hits over its
        tries, with `prior_weight` imagined tries at the pooled rate (itself shrunk to `prior`)."""
        w = self.constants.prior_weight
        tries, hits = counts.tries[:n], counts.hits[:n]
        pooled = (hits.sum() + w * prior) / (tries.sum() + w)
        return (hits + w * pooled) / (tries + w), pooled

    def ceiling(self, key: str, n: int) -> float:
        """The most any a_j (j < n) of `expected(key, ...)` can be (uncapped, without hope)
        until the key (or a shorter match's, `prior`) next learns: each a_j is a weighted mean
        of its position's hit rate and the pooled rate, and that of the positions' hit rates and
        the key's prior, so none exceeds the
        largest of those; forgetting scales a key's tries and hits alike and leaves every hit
        rate as it is (to rounding, which `CEILING_SLACK` covers). Counts no round could have
        left (negative or not finite, from a damaged file) have none."""
        counts = self.counts(key)
        tries, hits = counts.tries[:n], counts.hits[:n]
        if not (np.isfinite(tries).all() and np.isfinite(hits).all()) or (
                (tries < 0).any() or (hits < 0).any()):
            return math.inf
        tried = tries > 0
        rates = (hits[tried] / tries[tried]).tolist()
        return max([self.prior(key), *rates]) + CEILING_SLACK

    def acceptance(self, key: str, hope: float = 0.0) -> np.ndarray:
        return self.counts(key).rates(self.prior(key), self.constants.prior_weight, hope)

    @property
    def scale(self) -> float:
        """Acceptance per unit of target confidence, shrunk towards 1 where data is thin."""
        w = self.constants.scale_prior_weight
        return (self.scale_hits + w) / (self.scale_conf + w)

    def learn(self, key: str, drafted: int, accepted: int,
              confidence: Sequence[float] = (), start: int = 0, done: bool = True) -> None:
        """A round drafted `drafted` tokens under `key` and `accepted` of them were kept;
        `confidence` is the target's top probability per row (model rounds teach `scale`);
        `start` and `done` learn a round in parts (`Counts.learn`)."""
        self._learning(key).learn(drafted, accepted, self.constants.decay, start, done)
        if key != MODEL:
            return
        seen = min(accepted + 1, drafted)
        if len(confidence) < seen:
            return
        self.scale_hits = self.constants.decay * self.scale_hits + min(accepted, seen)
        self.scale_conf = self.constants.decay * self.scale_conf + float(sum(confidence[:seen]))

    def forget(self, key: str) -> None:
        """Key `key` could have drafted a round and drafted nothing."""
        if key in self.keys:
            self.keys[key].forget(self.constants.decay)

    def observe_confidence(self, confidence: float, aged: bool = False, rounds: int = 1) -> None:
        """The target's confidence at a token no draft was tested on (a plain round's, or the
        row after a round's last tested one) predicts how a draft would have fared there; it
        counts as a fraction of an observation at every position. `aged`: the round already
        aged the counts. `rounds`: the plain rounds this reading stands for (plain rounds
        read the confidence only now and then): it ages the counts and weighs as that many."""
        a = min(self.scale * confidence, 1.0)
        m, w = self.model, self.constants.conf_weight * rounds
        if not aged:
            m.tries *= self.constants.decay ** rounds
            m.hits *= self.constants.decay ** rounds
        m.tries += w
        m.hits += w * a
        m.version += 1

    def as_dict(self) -> dict:
        return {"keys": {k: c.as_dict() for k, c in self.keys.items()},
                "scale_hits": self.scale_hits, "scale_conf": self.scale_conf}

    def restore(self, d: dict) -> None:
        """Take the counts of `as_dict` (raises ValueError or KeyError on a malformed one)."""
        keys = {str(k): Counts.from_dict(v) for k, v in d["keys"].items()}
        keys.setdefault(MODEL, Counts())
        self.keys = keys
        self._memo = self._top_memo = None
        self.scale_hits, self.scale_conf = float(d["scale_hits"]), float(d["scale_conf"])
