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

import numpy as np
import numpy.typing as npt

from engine.dist import I64, Dist
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


def distribution(logits: F32, params: SamplingParams) -> Dist:
    """Map one row of logits `[V]` to the sampling distribution, on its support.

    The work is what the settings need and no more: greedy is an argmax; temperature alone one
    float32 exp pass over the row (a dense `Dist`); top-k and min-p are thresholds on the logits
    found without sorting the row (`_top_k_threshold`), and only the tokens over them are
    exponentiated; top-p exponentiates the row once for its total and sorts only the tokens
    that can be in the nucleus. Ties at a top-k or top-p boundary are resolved as a full sort
    would: every token tied with the k-th largest stays in, and the nucleus keeps the lowest
    ids among tokens tied at its edge.
    """
    row = np.asarray(logits)
    n = row.size
    if params.greedy:
        return Dist.one_hot(n, int(np.argmax(row)))
    row = row.astype(np.float32, copy=False)
    t = params.temperature
    top_k = params.top_k if 0 < params.top_k < n else 0
    m = float(row.max())
    if not top_k and params.top_p >= 1.0 and params.min_p <= 0.0:
        e = np.subtract(row, m, dtype=np.float32)
        if t != 1.0:
            e *= np.float32(1.0 / t)
        np.exp(e, out=e)
        return Dist(n, None, e)
    # Shifted before dividing: at a tiny temperature logits / t overflows.
    ids = None
    if top_k:
        ids = np.flatnonzero(row >= _top_k_threshold(row, top_k))
    if params.top_p < 1.0:
        ids = _nucleus(row, ids, m, t, params.top_p)
    if params.min_p > 0.0:
        # p(x) >= min_p * p(max)  <=>  (l(x) - m) / t >= log(min_p); the floor is compared in
        # the logits' precision, float32.
        floor = np.float32(m + t * float(np.log(params.min_p)))
        ids = np.flatnonzero(row >= floor) if ids is None else ids[row[ids] >= floor]
    assert ids is not None
    return Dist(n, ids, _weights(row[ids], m, t))


def probabilities(logits: F32, params: SamplingParams) -> F64:
    """`distribution` as a float64 array over the vocabulary (rows `[n, V]` too): for tests,
    reports and research scripts; the engine keeps rows as `Dist`."""
    logits = np.asarray(logits)
    if logits.ndim == 2:
        return np.stack([probabilities(row, params) for row in logits])
    return distribution(logits, params).to_dense()


def _weights(values: F32, m: float, t: float) -> F32:
    e = np.subtract(values, m, dtype=np.float32)
    if t != 1.0:
        e *= np.float32(1.0 / t)
    return np.exp(e, out=e)


def _top_k_threshold(row: F32, k: int) -> float:
    """The k-th largest value of `row`. The k-th largest of the maxima of k or more blocks is a
    lower bound for it (k blocks each hold a value at least that large), so only the values
    over that bound, a few times k of them, are partitioned."""
    n = row.size
    size = max(16, n // max(4 * k, 64))
    if n // size < k:
        return float(np.partition(row, n - k)[n - k])
    full = n // size * size
    maxima = row[:full].reshape(-1, size).max(axis=1)
    if full < n:
        maxima = np.append(maxima, row[full:].max())
    bound = np.partition(maxima, maxima.size - k)[maxima.size - k]
    cand = row[row >= bound]
    return float(np.partition(cand, cand.size - k)[cand.size - k])


def _nucleus(row: F32, ids: I64 | None, m: float, t: float, top_p: float) -> I64:
    """Ids (ascending) of the smallest set of most likely tokens among `ids` (None: all) whose
    mass reaches `top_p` of theirs; the token that crosses the line stays in, and among tokens
    of equal probability the lower ids come first.

    Only tokens whose weight is at least c can be in it, for any c with c * (tokens under c)
    <= (1 - top_p) * total: the rest hold too little mass to be reached. So a first guess at c
    is tried and, if it leaves too little mass, the c that cannot fail."""
    vals = row if ids is None else row[ids]
    e = _weights(vals, m, t)
    total = float(e.sum(dtype=np.float64))
    target = top_p * total
    for c in (1e-3, (1.0 - top_p) * total / e.size):
        cand = np.flatnonzero(e >= c)
        if float(e[cand].sum(dtype=np.float64)) >= target or c <= 0:
            break
    order = cand[np.lexsort((cand, -vals[cand]))]
    cum = np.cumsum(e[order], dtype=np.float64)
    n_keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.size)
    kept = np.sort(order[:n_keep])
    return kept if ids is None else ids[kept]


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
    """The engine's one source of randomness: a token drawn from a distribution (`draw`) and a
    biased coin (`coin`), each consuming one uniform. Every random choice of a generation goes
    through these two methods, so a test can substitute a subclass that branches on every
    outcome and computes the exact law of the output (tests/exact_law.py)."""

    def __init__(self, seed: int | None = None) -> None:
        self._gen = np.random.default_rng(seed)

    def random(self) -> float:
        return float(self._gen.random())

    def draw(self, dist: Dist) -> int:
        """One token id from `dist` (inverse CDF)."""
        return dist.inverse_cdf(self.random())

    def coin(self, p: float) -> bool:
        """True with probability `p`."""
        return self.random() < p


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
