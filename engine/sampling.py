"""Sampling settings and the one logits-to-probabilities transform shared by target and draft.

Notation (used across the engine): `p` is the target's distribution, `q` the draft's. Both come
from `probabilities(logits, params)`, so temperature, top-k, top-p and min-p shape p and q the
same way and speculative sampling is exact with respect to the *transformed* target.

Order of the transform: temperature, then top-k, top-p (nucleus) and min-p on the tempered
distribution, then renormalisation. Temperature 0 means greedy: a one-hot at the argmax
(lowest token id on ties, like numpy's argmax).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import numpy.typing as npt

from engine.dist import I64, Dist, exp_shifted
from engine.errors import SettingsError

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise SettingsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SettingsError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise SettingsError(f"top-p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise SettingsError(f"min-p must be in [0, 1), got {self.min_p}")
        if self.seed is not None and self.seed < 0:
            raise SettingsError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def as_dict(self) -> dict:
        return asdict(self)


# Rows without a top-k exponentiate only the tokens within this many tempered nats of the top
# one; the others (each under e^-16 of it, together under 1.7% of a row's mass at 151,936
# tokens) are bounded, and drawn by rejection (engine/dist.py). Tests lower it to put tails
# in tiny vocabularies.
TAIL_NATS = 16.0
# Rows shorter than this are exponentiated whole: the bounds save nothing there, and cost calls.
LAZY_FROM = 4096


def distribution(logits: F32, params: SamplingParams) -> Dist:
    """Map one row of logits `[V]` to the sampling distribution, on its support.

    The work is what the settings need and no more: greedy is an argmax; top-k and min-p are
    thresholds on the logits found without sorting the row (`_top_k`), and only the
    tokens over them are exponentiated; top-p sorts only the tokens near the top and settles
    the nucleus from bounds on the row's total, exponentiating the whole row only when the
    bounds leave its edge open; temperature alone gives a lazy row (`Dist.softmax`). Ties at a
    top-k or top-p boundary are resolved as a full sort would: every token tied with the k-th
    largest stays in, and the nucleus keeps the lowest ids among tokens tied at its edge.
    """
    row = np.asarray(logits)
    n = row.size
    if params.greedy:
        return Dist.one_hot(n, int(np.argmax(row)))
    row = row.astype(np.float32, copy=False)
    t = params.temperature
    # Shifted before scaling: at a tiny temperature logits / t overflows.
    inv_t = 1.0 / t
    top_k = params.top_k if 0 < params.top_k < n else 0
    if top_k:
        return _top_k_row(row, _top_k(row, top_k), inv_t, params)
    ids = None
    m = float(row.max())
    if params.top_p < 1.0:
        ids = _nucleus(row, m, inv_t, params.top_p)
    if params.min_p > 0.0:
        # p(x) >= min_p * p(max)  <=>  (l(x) - m) / t >= log(min_p); the floor is compared in
        # the logits' precision, float32.
        floor = np.float32(m + t * float(np.log(params.min_p)))
        ids = np.flatnonzero(row >= floor) if ids is None else ids[row[ids] >= floor]
    if ids is None:
        if n < LAZY_FROM:
            return Dist(n, None, exp_shifted(row, m, inv_t))
        return Dist.softmax(row, m, inv_t, TAIL_NATS)
    return Dist(n, ids, exp_shifted(row[ids], m, inv_t))


def _top_k_row(row: F32, ids: I64, inv_t: float, params: SamplingParams) -> Dist:
    """The row on a top-k set `ids`, then top-p and min-p within it: the k weights are computed
    once and every later cut is a selection of them."""
    vals = row[ids]
    m = float(vals.max())
    e = exp_shifted(vals, m, inv_t)
    keep = np.arange(ids.size)
    if params.top_p < 1.0:
        order = np.lexsort((ids, -vals))
        cum = np.cumsum(e[order], dtype=np.float64)
        k = int(np.searchsorted(cum, params.top_p * cum[-1], side="left")) + 1
        keep = np.sort(order[:min(k, ids.size)])
    if params.min_p > 0.0:
        floor = np.float32(m + params.temperature * float(np.log(params.min_p)))
        keep = keep[vals[keep] >= floor]
    return Dist(row.size, ids[keep], e[keep])


def probabilities(logits: F32, params: SamplingParams) -> F64:
    """`distribution` as a float64 array over the vocabulary (rows `[n, V]` too): for tests,
    reports and research scripts; the engine keeps rows as `Dist`."""
    logits = np.asarray(logits)
    if logits.ndim == 2:
        return np.stack([probabilities(row, params) for row in logits])
    return distribution(logits, params).to_dense()


def _top_k(row: F32, k: int) -> I64:
    """Ids (ascending) of the k largest values of `row` and every value tied with the k-th.
    The k-th largest of any k or more of the values is a lower bound for the k-th largest of
    all, so a strided sample gives a bound that about k * stride values pass: one comparison
    pass finds them, and only they are partitioned."""
    n = row.size
    stride = max(1, min(32, n // (64 * k)))
    sample = row[::stride]
    if sample.size < k:
        sample = row
    bound = np.partition(sample, sample.size - k)[sample.size - k]
    cand = np.flatnonzero(row >= bound)
    vals = row[cand]
    kth = np.partition(vals, vals.size - k)[vals.size - k]
    return cand[vals >= kth]


def _edge(ids: I64, vals: F32, e: F32, target_lo: float, target_hi: float) -> I64 | None:
    """The nucleus among `ids` when its mass target is known to lie in [target_lo, target_hi]:
    most likely first, lower ids first among equals, the token that crosses the line kept.
    None when the edge differs between the two ends of the interval."""
    order = np.lexsort((ids, -vals))
    cum = np.cumsum(e[order], dtype=np.float64)
    k_lo = int(np.searchsorted(cum, target_lo, side="left")) + 1
    k_hi = int(np.searchsorted(cum, target_hi, side="left")) + 1
    if k_lo != k_hi:
        return None
    return np.sort(ids[order[:min(k_lo, ids.size)]])


def _nucleus_of(row: F32, ids: I64, m: float, inv_t: float, top_p: float) -> I64:
    """The nucleus of the tokens `ids` (a top-k set, or every token), all exponentiated. Only
    tokens of weight at least c can be in it, for any c with c * (tokens under c) <=
    (1 - top_p) * total: the rest hold too little mass to be reached. So only those are
    sorted: a first guess at c, then, if it leaves too little mass, the c that cannot fail."""
    vals = row[ids]
    e = exp_shifted(vals, m, inv_t)
    total = float(e.sum(dtype=np.float64))
    target = top_p * total
    for c in (1e-3, (1.0 - top_p) * total / e.size):
        cand = np.flatnonzero(e >= c)
        if float(e[cand].sum(dtype=np.float64)) >= target:
            break
    kept = _edge(ids[cand], vals[cand], e[cand], target, target)
    assert kept is not None
    return kept


def _nucleus(row: F32, m: float, inv_t: float, top_p: float) -> I64:
    """The nucleus of the whole row. Every token more than TAIL_NATS below the top weighs under
    e^-TAIL_NATS, so the tokens over that floor, exponentiated, bound the row's total. When the
    nucleus lies within them (their mass is at least top-p of the bound) and its edge is the
    same at both ends of the bound, it is settled without the rest; when only the edge is
    open, the row's exact total settles it; else every token is a candidate."""
    if row.size < LAZY_FROM:
        return _nucleus_of(row, np.arange(row.size), m, inv_t, top_p)
    floor = np.float32(m - TAIL_NATS / inv_t)
    near = np.flatnonzero(row >= floor)
    e = exp_shifted(row[near], m, inv_t)
    lo = float(e.sum(dtype=np.float64))
    hi = lo + (row.size - near.size) * float(np.exp(-TAIL_NATS)) * (1 + 1e-6)
    if top_p * hi > lo:
        return _nucleus_of(row, np.arange(row.size), m, inv_t, top_p)
    vals = row[near]
    kept = _edge(near, vals, e, top_p * lo, top_p * hi)
    if kept is None:
        total = float(exp_shifted(row, m, inv_t).sum(dtype=np.float64))
        kept = _edge(near, vals, e, top_p * total, top_p * total)
    assert kept is not None
    return kept


class Rows:
    """Lazy `distribution` over rows of logits: row i is transformed on first access."""

    def __init__(self, logits: F32, params: SamplingParams) -> None:
        self._logits = logits
        self._params = params
        self._rows: dict[int, Dist] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> Dist:
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = distribution(self._logits[i], self._params)
        return row


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


# `top_probability` exponentiates exactly the tokens within this many nats of the row's maximum
# and estimates the rest (each under e^-12 of the top token) from every SAMPLE_STRIDE-th of them.
NEAR_NATS = 12.0
SAMPLE_STRIDE = 64
# Rows up to this size are exponentiated whole.
EXACT_UP_TO = 8192


def top_probability(logits: F32) -> F64:
    """Per row, the largest probability of softmax(logits) at temperature 1: how sure the model
    is of its next token, whatever the sampling settings. A statistic for policies and stopping
    rules, never part of p or q, so a long row's is an estimate: the tokens near the top
    exactly, the far tail (each under e^-12 of the top, together a few percent of the mass at
    most) from a fixed stride of its entries, which kept the estimate within 0.1% of
    the exact value without an exp over all 151,936 entries (0.33 ms a row on an AVX2 CPU,
    where numpy's float32 exp is scalar)."""
    z = np.asarray(logits, dtype=np.float32)
    if z.ndim == 2:
        return np.array([float(top_probability(row)[0]) for row in z])
    m = z.max()
    if z.size <= EXACT_UP_TO:
        e = np.exp(z - m)
        return np.array([1.0 / float(e.sum(dtype=np.float64))])
    floor = m - np.float32(NEAR_NATS)
    near = z[z >= floor]
    tail = z[::SAMPLE_STRIDE]
    tail = tail[tail < floor]
    total = (float(np.exp(near - m).sum(dtype=np.float64))
             + SAMPLE_STRIDE * float(np.exp(tail - m).sum(dtype=np.float64)))
    return np.array([1.0 / total])
