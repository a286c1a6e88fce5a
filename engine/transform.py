"""The one logits-to-probabilities transform shared by target and draft, and `Rows`, its lazy
application to a batch of logit rows.

Order of the transform: temperature, then top-k, top-p (nucleus) and min-p on the tempered
distribution, then renormalisation. Temperature 0 means greedy: a one-hot at the argmax
(lowest token id on ties, like numpy's argmax). The settings are engine/sampling.py's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.dist import I64, Dist, exp_shifted

if TYPE_CHECKING:
    from engine.sampling import SamplingParams

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


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
            row = self._rows[i] = self._transform(i)
        return row

    def _transform(self, i: int) -> Dist:
        return distribution(self._logits[i], self._params)
