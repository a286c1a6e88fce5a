"""One row of p or q: a distribution over the vocabulary, kept on its support.

A row after top-k, top-p or min-p holds tens to a few thousand tokens of a 151,936-token
vocabulary, so it is stored as sorted token ids with unnormalised weights and everything that
reads it (a token's probability, a draw, the residual of the acceptance rule) works on the
support alone. A row without truncation (temperature only) is dense: `ids is None` and `w`
covers the vocabulary; its draw reads block sums instead of a full cumulative sum.

    ids   [n] int64, ascending (None: every token, ids = arange(n_vocab))
    w     [n] float32 or float64, >= 0, unnormalised
    total float, the sum of w

Example: Dist.sparse(8, [2, 5], [3.0, 1.0]) is p(2) = 0.75, p(5) = 0.25, p(x) = 0 elsewhere.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Weights = npt.NDArray[np.floating]

# A dense row is drawn from by block: the block sums locate the block, one block's cumulative sum
# the token (two short scans instead of one over 151,936 entries).
BLOCK = 1024


class Dist:
    __slots__ = ("ids", "w", "total", "n_vocab", "_blocks")

    def __init__(self, n_vocab: int, ids: I64 | None, w: Weights, total: float | None = None,
                 blocks: F64 | None = None) -> None:
        self.n_vocab = n_vocab
        self.ids = ids
        self.w = w
        self._blocks = blocks
        if total is None:
            if ids is None and blocks is None and w.size > 4 * BLOCK:
                blocks = self._blocks = _block_sums(w)
                total = float(blocks.sum())
            else:
                total = float(np.sum(w, dtype=np.float64))
        self.total = total

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
        return cls(n_vocab, np.array([token], dtype=np.int64), np.ones(1), 1.0)

    # --- reading --------------------------------------------------------------------------------
    def prob(self, x: int) -> float:
        """p(x)."""
        if self.ids is None:
            return float(self.w[x]) / self.total
        i = int(np.searchsorted(self.ids, x))
        if i < self.ids.size and self.ids[i] == x:
            return float(self.w[i]) / self.total
        return 0.0

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
        return float(self.w.max()) / self.total

    def argmax(self) -> int:
        """The most likely token (the lowest id among equals)."""
        i = int(np.argmax(self.w))
        return i if self.ids is None else int(self.ids[i])

    def __len__(self) -> int:
        """The size of the stored support (zeros included for a dense row)."""
        return int(self.w.size)

    # --- drawing --------------------------------------------------------------------------------
    def inverse_cdf(self, u: float) -> int:
        """The token at quantile `u` in [0, 1) of the cumulative distribution in id order."""
        v = u * self.total
        w = self.w
        if self.ids is None and w.size > 4 * BLOCK:
            blocks = self._blocks if self._blocks is not None else _block_sums(w)
            self._blocks = blocks
            cum = np.cumsum(blocks)
            b = _clamp_positive(int(np.searchsorted(cum, v, side="right")), blocks)
            start = b * BLOCK
            inner = w[start:start + BLOCK]
            v -= float(cum[b - 1]) if b else 0.0
            k = _clamp_positive(int(np.searchsorted(np.cumsum(inner, dtype=np.float64), v,
                                                    side="right")), inner)
            return start + k
        cum = np.cumsum(w, dtype=np.float64)
        k = _clamp_positive(int(np.searchsorted(cum, v, side="right")), w)
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
            r = self.to_probs_dense(np.float64)
            r -= q.to_probs_dense(np.float64)
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

    def to_probs_dense(self, dtype: type = np.float64) -> npt.NDArray[np.floating]:
        """Normalised probabilities over the vocabulary, a new array of `dtype`."""
        if self.ids is None:
            return np.divide(self.w, self.total, dtype=dtype)
        out = np.zeros(self.n_vocab, dtype=dtype)
        out[self.ids] = self.w / self.total
        return out


def _block_sums(w: Weights) -> F64:
    n = w.size // BLOCK * BLOCK
    sums = w[:n].reshape(-1, BLOCK).sum(axis=1, dtype=np.float64)
    if n < w.size:
        sums = np.append(sums, np.sum(w[n:], dtype=np.float64))
    return sums


def _clamp_positive(k: int, w: Weights) -> int:
    """A searchsorted index past the end (rounding at u ~ 1) or on a zero weight moves to the
    last positive weight at or before it: a draw never lands where the probability is zero."""
    k = min(k, w.size - 1)
    if w[k] > 0:
        return k
    nz = np.flatnonzero(w[:k + 1] > 0)
    return int(nz[-1]) if nz.size else int(np.flatnonzero(w > 0)[0])
