"""One row of p or q: a distribution over the vocabulary, kept on its support.

A row after top-k, top-p or min-p holds tens to a few thousand tokens of a 151,936-token
vocabulary, so it is stored as sorted token ids with unnormalised weights, and everything that
reads it (a token's probability, a draw, the residual of the acceptance rule) works on the
support alone:

    ids   [n] int64, ascending (None: every token, ids = arange(n_vocab))
    w     [n] float32 or float64, >= 0, unnormalised
    total float, the sum of w

A row with temperature alone keeps the whole vocabulary, and exponentiating 151,936 logits costs
0.33 ms on an AVX2 CPU, where numpy's float32 exp is scalar: more than the rest of a token's
engine time. So such a row starts *lazy* (`Dist.softmax`): only the tokens within `tail_nats`
of the maximum (in tempered nats) are exponentiated. Every other token weighs under e^-tail_nats
of the top one, so its total is bounded, and
- a draw is exact without the rest: the near tokens by their weights, the tail by rejection
  (a uniform token, kept with probability weight / e^-tail_nats), which together give each
  token exactly its weight (`sample`);
- a probability is known within bounds (`prob_bounds`), which settle most acceptance tests
  exactly (`Rng.coin_bounded`); the exact value exponentiates the row once (`materialise`).

Example: Dist.sparse(8, [2, 5], [3.0, 1.0]) is p(2) = 0.75, p(5) = 0.25, p(x) = 0 elsewhere.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Weights = npt.NDArray[np.floating]

# A dense row is drawn from by block: the block sums locate the block, one block's cumulative sum
# the token (two short scans instead of one over 151,936 entries).
BLOCK = 1024
# A lazy row's far tokens are sampled at this stride to estimate their mass for statistics.
TAIL_STRIDE = 64


class Dist:
    __slots__ = ("n_vocab", "ids", "_w", "_total", "_blocks", "_cum", "_lazy")

    def __init__(self, n_vocab: int, ids: I64 | None, w: Weights, total: float | None = None
                 ) -> None:
        self.n_vocab = n_vocab
        self.ids = ids
        self._w: Weights | None = w
        self._blocks: F64 | None = None
        self._cum: F64 | None = None
        self._lazy: _Near | None = None
        if total is None:
            if ids is None and w.size > 4 * BLOCK:
                self._blocks = _block_sums(w)
                total = float(self._blocks.sum())
            else:
                total = float(np.sum(w, dtype=np.float64))
        self._total: float | None = total

    # --- constructors ---------------------------------------------------------------------------
    @classmethod
    def dense(cls, probs: npt.ArrayLike) -> "Dist":
        """A row given over the whole vocabulary (any non-negative weights)."""
        w = np.asarray(probs)
        return cls(w.size, None, w)

    @classmethod
    def sparse(cls, n_vocab: int, ids: npt.ArrayLike, w: npt.ArrayLike) -> "Dist":
        """A row on `ids` (any order, no repeats); zero weights are dropped."""
        ids = np.asarray(ids, dtype=np.int64)
        w = np.asarray(w)
        order = np.argsort(ids, kind="stable")
        ids, w = ids[order], w[order]
        keep = w > 0
        if not keep.all():
            ids, w = ids[keep], w[keep]
        return cls(n_vocab, ids, w)

    @classmethod
    def one_hot(cls, n_vocab: int, token: int) -> "Dist":
        return cls(n_vocab, np.array([token], dtype=np.int64), _ONE, 1.0)

    @classmethod
    def softmax(cls, row: F32, m: float, inv_t: float, tail_nats: float) -> "Dist":
        """softmax((row - m) * inv_t) over the whole vocabulary (m the row's maximum), lazily:
        the tokens within `tail_nats` of the top exponentiated, the rest bounded."""
        floor = np.float32(m - tail_nats / inv_t)
        near = np.flatnonzero(row >= floor)
        if near.size * 2 >= row.size:
            w = exp_shifted(row, m, inv_t)
            return cls(row.size, None, w)
        d = cls.__new__(cls)
        d.n_vocab, d.ids, d._w, d._total, d._blocks, d._cum = row.size, None, None, None, None, None
        near_w = exp_shifted(row[near], m, inv_t)
        d._lazy = _Near(row, m, inv_t, tail_nats, floor, near, near_w)
        return d

    # --- the weights, exponentiated on first need -----------------------------------------------
    @property
    def w(self) -> Weights:
        if self._w is None:
            self.materialise()
        assert self._w is not None
        return self._w

    @property
    def total(self) -> float:
        if self._total is None:
            self.materialise()
        assert self._total is not None
        return self._total

    @property
    def lazy(self) -> bool:
        return self._w is None

    def materialise(self) -> None:
        """Exponentiate the whole row (a lazy row's one full pass)."""
        near = self._lazy
        if self._w is not None or near is None:
            return
        w = exp_shifted(near.row, near.m, near.inv_t)
        self._blocks = _block_sums(w)
        self._w, self._total = w, float(self._blocks.sum())

    # --- reading --------------------------------------------------------------------------------
    def weight(self, x: int) -> float:
        """x's unnormalised weight (exact without materialising)."""
        near = self._lazy
        if self._w is None and near is not None:
            return near.weight(x)
        if self.ids is None:
            return float(self.w[x])
        i = int(np.searchsorted(self.ids, x))
        return float(self.w[i]) if i < self.ids.size and self.ids[i] == x else 0.0

    def prob(self, x: int) -> float:
        """p(x)."""
        total = self.total  # first: it materialises a lazy row, whose weights then serve
        return self.weight(x) / total

    def total_bounds(self) -> tuple[float, float]:
        near = self._lazy
        if self._w is None and near is not None:
            return near.total, near.total + near.tail_bound
        return self.total, self.total

    def prob_bounds(self, x: int) -> tuple[float, float]:
        """Bounds on p(x) that need no full pass: exact once the row is materialised."""
        w = self.weight(x)
        lo, hi = self.total_bounds()
        return w / hi, w / lo

    def total_estimate(self) -> float:
        near = self._lazy
        if self._w is None and near is not None:
            return near.total + near.tail_estimate()
        return self.total

    def prob_estimate(self, x: int) -> float:
        """p(x), a lazy row's with its tail's mass estimated from a sample of it (within 0.1%
        on the embedded target's rows): for statistics such as a draft's confidence in its
        run, never for the rule."""
        return self.weight(x) / self.total_estimate()

    def support(self) -> tuple[I64, F64]:
        """(ids, probabilities) of every token with probability > 0, ids ascending."""
        ids = np.arange(self.n_vocab) if self.ids is None else self.ids
        keep = self.w > 0
        return ids[keep], self.w[keep].astype(np.float64) / self.total

    def to_dense(self) -> F64:
        """The row as a float64 array over the vocabulary (tests and reports, not the hot path)."""
        out = np.zeros(self.n_vocab, dtype=np.float64)
        ids, probs = self.support()
        out[ids] = probs
        return out

    def max_prob(self) -> float:
        """The largest probability (a lazy row's estimated, as `prob_estimate`)."""
        near = self._lazy
        if self._w is None and near is not None:
            return float(near.w.max()) / self.total_estimate()
        return float(self.w.max()) / self.total

    def argmax(self) -> int:
        """The most likely token (the lowest id among equals)."""
        near = self._lazy
        if self._w is None and near is not None:
            return int(near.ids[int(np.argmax(near.w))])
        i = int(np.argmax(self.w))
        return i if self.ids is None else int(self.ids[i])

    def __len__(self) -> int:
        """The size of the stored support (zeros included for a dense row)."""
        return self.n_vocab if self.ids is None else int(self.ids.size)

    # --- drawing --------------------------------------------------------------------------------
    def sample(self, random: Callable[[], float]) -> int:
        """One token, from uniforms in [0, 1) that `random` gives (one, or a few for a lazy row)."""
        near = self._lazy
        if self._w is None and near is not None:
            return near.sample(random)
        return self.inverse_cdf(random())

    def inverse_cdf(self, u: float) -> int:
        """The token at quantile `u` in [0, 1) of the cumulative distribution in id order."""
        v = u * self.total
        w = self.w
        if self.ids is None and w.size > 4 * BLOCK:
            if self._blocks is None:
                self._blocks = _block_sums(w)
            cum = np.cumsum(self._blocks)
            b = _clamp_positive(int(np.searchsorted(cum, v, side="right")), self._blocks)
            start = b * BLOCK
            inner = w[start:start + BLOCK]
            v -= float(cum[b - 1]) if b else 0.0
            k = _clamp_positive(int(np.searchsorted(np.cumsum(inner, dtype=np.float64), v,
                                                    side="right")), inner)
            return start + k
        if self._cum is None:
            self._cum = np.cumsum(w, dtype=np.float64)
        k = _clamp_positive(int(np.searchsorted(self._cum, v, side="right")), w)
        return k if self.ids is None else int(self.ids[k])

    # --- the acceptance rule's residual ---------------------------------------------------------
    def without(self, x: int) -> "Dist":
        """This row with token x removed (the one-hot rule's residual); unchanged when nothing
        else is left, where the rule never asks for it."""
        if self.ids is None:
            w = self.w.copy()
            w[x] = 0
            out = Dist(self.n_vocab, None, w)
        else:
            keep = self.ids != x
            out = Dist(self.n_vocab, self.ids[keep], self.w[keep])
        return out if out.total > 0 else self

    def residual(self, q: "Dist") -> "Dist":
        """norm(max(0, p - q)) with p = self, formed on the union of the two supports; p itself
        when p == q up to rounding (a rejection is then impossible)."""
        if self.ids is None or q.ids is None:
            # float64: the difference of two nearly equal rows is where float32 would round.
            r = self.to_probs_dense()
            r -= q.to_probs_dense()
            np.maximum(r, 0.0, out=r)
            out = Dist(self.n_vocab, None, r)
        else:
            ids = np.union1d(self.ids, q.ids)
            r = self.probs_at(ids) - q.probs_at(ids)
            np.maximum(r, 0.0, out=r)
            keep = r > 0
            out = Dist(self.n_vocab, ids[keep], r[keep])
        return out if out.total > 0 else self

    def probs_at(self, ids: I64) -> F64:
        """p at each of `ids` (ascending), zero off the support."""
        if self.ids is None:
            return self.w[ids].astype(np.float64) / self.total
        pos = np.searchsorted(self.ids, ids)
        pos_c = np.minimum(pos, self.ids.size - 1)
        hit = self.ids[pos_c] == ids
        return np.where(hit, self.w[pos_c].astype(np.float64) / self.total, 0.0)

    def to_probs_dense(self) -> F64:
        """Normalised float64 probabilities over the vocabulary, a new array."""
        if self.ids is None:
            return np.divide(self.w, self.total, dtype=np.float64)
        out = np.zeros(self.n_vocab, dtype=np.float64)
        out[self.ids] = self.w / self.total
        return out


class _Near:
    """A lazy softmax row's exponentiated part: the tokens within `tail_nats` of the top."""

    __slots__ = ("row", "m", "inv_t", "tail_nats", "floor", "ids", "w", "total", "tail_bound",
                 "_cum", "_tail_estimate")

    def __init__(self, row: F32, m: float, inv_t: float, tail_nats: float, floor: np.float32,
                 ids: I64, w: F32) -> None:
        self.row, self.m, self.inv_t, self.tail_nats, self.floor = row, m, inv_t, tail_nats, floor
        self.ids, self.w = ids, w
        self.total = float(np.sum(w, dtype=np.float64))
        # Each far token weighs under e^-tail_nats (the top token weighs 1).
        self.tail_bound = (row.size - ids.size) * float(np.exp(-tail_nats))
        self._cum = np.cumsum(w, dtype=np.float64)
        self._tail_estimate: float | None = None

    def tail_estimate(self) -> float:
        """The far tokens' total weight, from every TAIL_STRIDE-th of them (all of a short row)."""
        if self._tail_estimate is None:
            stride = TAIL_STRIDE if self.row.size > 256 * TAIL_STRIDE else 1
            sample = self.row[::stride]
            sample = sample[sample < self.floor]
            est = stride * float(exp_shifted(sample, self.m, self.inv_t).sum(dtype=np.float64))
            self._tail_estimate = min(est, self.tail_bound)
        return self._tail_estimate

    def weight(self, x: int) -> float:
        if self.row[x] >= self.floor:
            i = int(np.searchsorted(self.ids, x))
            return float(self.w[i])
        # As the full pass would compute it (float32), so bounds and exact values agree.
        return float(exp_shifted(self.row[x:x + 1], self.m, self.inv_t)[0])

    def sample(self, random: Callable[[], float]) -> int:
        """Exact: a near token with probability near.total / S, else a uniform token proposed
        with probability V e^-tail_nats / S and kept with probability weight / e^-tail_nats
        (near tokens proposed this way are turned down); each token's chance per attempt is
        its weight / S, so the token finally returned has probability weight / total."""
        n = self.row.size
        envelope = float(np.exp(-self.tail_nats))
        s = self.total + n * envelope
        while True:
            v = random() * s
            if v < self.total:
                k = _clamp_positive(int(np.searchsorted(self._cum, v, side="right")), self.w)
                return int(self.ids[k])
            j = min(int(random() * n), n - 1)
            if self.row[j] >= self.floor:
                continue
            keep = np.exp((float(self.row[j]) - self.m) * self.inv_t + self.tail_nats)
            if random() < keep:
                return j


_ONE = np.ones(1)


# 1 / temperature is capped here: past it every float32 logit gap already scales to -inf in
# the exponent, and 1 / 1e-300 would be inf in float32, whose product with the top's 0 is NaN.
MAX_INV_T = 1e30


def exp_shifted(values: F32, m: float, inv_t: float) -> F32:
    """exp((values - m) * inv_t) in float32, as a new array."""
    e = np.subtract(values, np.float32(m), dtype=np.float32)
    if inv_t != 1.0:
        e *= np.float32(min(inv_t, MAX_INV_T))
    return np.exp(e, out=e)


def _block_sums(w: Weights) -> F64:
    n = w.size // BLOCK * BLOCK
    sums = w[:n].reshape(-1, BLOCK).sum(axis=1).astype(np.float64)
    if n < w.size:
        sums = np.append(sums, float(np.sum(w[n:], dtype=np.float64)))
    return sums


def _clamp_positive(k: int, w: Weights) -> int:
    """A searchsorted index past the end (rounding at u ~ 1) or on a zero weight moves to the
    last positive weight at or before it: a draw never lands where the probability is zero."""
    k = min(k, w.size - 1)
    if w[k] > 0:
        return k
    nz = np.flatnonzero(w[:k + 1] > 0)
    return int(nz[-1]) if nz.size else int(np.flatnonzero(w > 0)[0])
