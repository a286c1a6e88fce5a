"""Verification rules: which drafted tokens the target keeps, and the token that follows them.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023). With target rows
`p[0..γ]` (`p[i]` is the target's distribution for position i given the prefix and draft tokens
x_0..x_{i-1}) and draft rows `q[0..γ-1]`:
  accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
  at the first rejection emit a token from norm(max(0, p_i - q_i)) and stop;
  if all γ are accepted emit a bonus token from p_γ.
Rows are `Dist`s (engine/dist.py): each read is on the row's support, never the whole
vocabulary, unless the row is dense (temperature alone).
The emitted tokens are then distributed exactly as sampling from p one token at a time.

Greedy (temperature 0) is the special case with one-hot p and q: accept while x_i is the
target's argmax, then emit the argmax. A drafter without probabilities is the special case
q_i = one-hot(x_i): accept with probability p_i(x_i), residual p_i with x_i removed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

from engine.dist import Dist
from engine.errors import DraftLawError
from engine.rng import Rng
from engine.transform import Rows

# Target rows: `Rows` (transformed lazily, so a round rejected at position 0 pays for one row,
# not γ+1) or any sequence of `Dist`.
RowsLike = Rows | Sequence[Dist]

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    token: int
    # "correction" after a rejection, "bonus" when every drafted token was accepted.
    kind: str


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)), on the union of the two supports; p itself when p == q up to
    rounding (rejection impossible)."""
    return p.residual(q)


def speculative_verify(p: RowsLike, q: Sequence[Dist], draft: I32, rng: Rng) -> Verdict:
    """Leviathan/Chen rule. `p`: γ+1 target rows, `q`: γ draft rows, `draft`: [γ].

    Example (V = 3): p_0 = (0.5, 0.5, 0), q_0 = (0.9, 0.1, 0), x_0 = 0: accepted with
    probability 0.5 / 0.9; on rejection the token comes from norm(max(0, p_0 - q_0)) = (0, 1, 0).
    """
    gamma = len(draft)
    for i in range(gamma):
        x = int(draft[i])
        pi, qi = p[i], q[i]
        if qi.weight(x) <= 0.0:
            # x did not come from q_i, so the rule's premise is false and no emission from it
            # would be exact (always taking the residual, as this once did, biases the output).
            raise DraftLawError(f"drafted token {x} at position {i} has probability 0 under the "
                                "draft's declared distribution: the drafter and its q disagree")
        # A lazy row knows p(x) within bounds (engine/dist.py): they settle most coins, and the
        # exact ratio is computed only when the uniform falls between them.
        p_lo, p_hi = pi.prob_bounds(x)
        q_lo, q_hi = qi.prob_bounds(x)
        if p_lo >= q_hi or rng.coin_bounded(p_lo / q_hi, p_hi / q_lo,
                                            lambda: pi.prob(x) / qi.prob(x)):
            continue
        return Verdict(i, rng.draw_residual(pi, qi), "correction")
    return Verdict(gamma, rng.draw(p[gamma]), "bonus")


def one_hot_verify(p: RowsLike, draft: I32, rng: Rng) -> Verdict:
    """The rule for drafters that give no probabilities: q_i is one-hot at x_i."""
    gamma = len(draft)
    for i in range(gamma):
        x = int(draft[i])
        pi = p[i]
        lo, hi = pi.prob_bounds(x)
        if rng.coin_bounded(lo, hi, lambda: pi.prob(x)):
            continue
        return Verdict(i, rng.draw_without(pi, x), "correction")
    return Verdict(gamma, rng.draw(p[gamma]), "bonus")


def greedy_verify(p: RowsLike, draft: I32) -> Verdict:
    """Temperature 0: keep the longest prefix that matches the target's argmax."""
    gamma = len(draft)
    for i in range(gamma):
        best = p[i].argmax()
        if int(draft[i]) != best:
            return Verdict(i, best, "correction")
    return Verdict(gamma, p[gamma].argmax(), "bonus")


def verify(p: RowsLike, q: Sequence[Dist] | None, draft: I32, rng: Rng,
           greedy: bool) -> Verdict:
    """Pick the rule: greedy, one-hot (no q), or full speculative sampling."""
    if greedy:
        return greedy_verify(p, draft)
    if q is None:
        return one_hot_verify(p, draft, rng)
    return speculative_verify(p, q, draft, rng)
