"""Verification rules: which drafted tokens the target keeps, and the token that follows them.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023). With target rows
`p[0..γ]` (`p[i]` is the target's distribution for position i given the prefix and draft tokens
x_0..x_{i-1}) and draft rows `q[0..γ-1]`:
  accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
  at the first rejection emit a token from norm(max(0, p_i - q_i)) and stop;
  if all γ are accepted emit a bonus token from p_γ.
`p` may be any row-indexable object (an array, or `Rows`, which transforms logits lazily so a
round rejected at position 0 pays for one row, not γ+1).
The emitted tokens are then distributed exactly as sampling from p one token at a time.

Greedy (temperature 0) is the special case with one-hot p and q: accept while x_i is the
target's argmax, then emit the argmax. A drafter without probabilities is the special case
q_i = one-hot(x_i): accept with probability p_i(x_i), residual p_i with x_i removed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.errors import DraftLawError
from engine.sampling import F64, Rng, Rows

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    token: int
    # "correction" after a rejection, "bonus" when every drafted token was accepted.
    kind: str


def residual(p: F64, q: F64) -> F64:
    """norm(max(0, p - q)); falls back to p when p == q up to rounding (rejection impossible)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def speculative_verify(p: F64, q: F64, draft: I32, rng: Rng) -> Verdict:
    """Leviathan/Chen rule. `p`: [γ+1, V] target rows, `q`: [γ, V] draft rows, `draft`: [γ]."""
    gamma = len(draft)
    for i in range(gamma):
        x = int(draft[i])
        pi, qi = p[i], q[i]
        px, qx = pi[x], qi[x]
        if qx <= 0.0:
            # x did not come from q_i, so the rule's premise is false and no emission from it
            # would be exact (always taking the residual, as this once did, biases the output).
            raise DraftLawError(f"drafted token {x} at position {i} has probability 0 under the "
                                "draft's declared distribution: the drafter and its q disagree")
        if px >= qx or rng.coin(px / qx):
            continue
        return Verdict(i, rng.draw(residual(pi, qi)), "correction")
    return Verdict(gamma, rng.draw(p[gamma]), "bonus")


def one_hot_verify(p: F64, draft: I32, rng: Rng) -> Verdict:
    """The rule for drafters that give no probabilities: q_i is one-hot at x_i."""
    gamma = len(draft)
    for i in range(gamma):
        x = int(draft[i])
        pi = p[i]
        if rng.coin(pi[x]):
            continue
        r = pi.copy()
        r[x] = 0.0
        total = r.sum()
        return Verdict(i, rng.draw(r / total if total > 0 else pi), "correction")
    return Verdict(gamma, rng.draw(p[gamma]), "bonus")


def greedy_verify(p: F64, draft: I32) -> Verdict:
    """Temperature 0: keep the longest prefix that matches the target's argmax."""
    gamma = len(draft)
    for i in range(gamma):
        best = int(np.argmax(p[i]))
        if int(draft[i]) != best:
            return Verdict(i, best, "correction")
    return Verdict(gamma, int(np.argmax(p[gamma])), "bonus")


def verify(p: Rows | F64, q: F64 | None, draft: I32, rng: Rng, greedy: bool) -> Verdict:
    """Pick the rule: greedy, one-hot (no q), or full speculative sampling."""
    if greedy:
        return greedy_verify(p, draft)
    if q is None:
        return one_hot_verify(p, draft, rng)
    return speculative_verify(p, q, draft, rng)
