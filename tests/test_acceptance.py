"""Monte Carlo exactness of the acceptance rules on synthetic p and q (no model needed).

A speculative round over a tiny Markov chain (target P, draft Q, both [V, V] transition
matrices) emits tokens; the distribution of the first emitted token and of the first two jointly
must match the target's (chi-square at a fixed seed). The same test run with a deliberately
wrong rule must fail: that is what shows the test can fail.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from engine.acceptance import Verdict, greedy_verify, one_hot_verify, residual, speculative_verify
from engine.dist import Dist
from engine.errors import DraftLawError
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import probabilities

V = 6
N = 20000
ALPHA = 1e-3


def wrong_rule(p, q, draft, rng):
    """Biased on purpose: resamples from p instead of the residual on rejection."""
    for i, x in enumerate(draft):
        if rng.random() < min(1.0, p[i].prob(x) / q[i].prob(x)):
            continue
        return Verdict(i, rng.draw(p[i]), "correction")
    return Verdict(len(draft), rng.draw(p[len(draft)]), "bonus")


def chain(seed: int, temp: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([probabilities(rng.standard_normal(V) * 2, SamplingParams(temperature=temp))
                     for _ in range(V)])


def draft_chains(Q, starts, gamma, gen):
    """One Markov chain of `gamma` draft tokens from each start context, all drawn at once
    (inverse CDF over the rows of Q): the Monte Carlo's bulk, kept out of the per-round loop."""
    cdf = np.cumsum(Q, axis=1)
    chains = np.empty((len(starts), gamma), dtype=np.int32)
    ctx = np.asarray(starts)
    for j in range(gamma):
        u = gen.random(len(ctx))[:, None] * cdf[ctx, -1:]
        ctx = np.minimum((cdf[ctx] <= u).sum(axis=1), V - 1)
        chains[:, j] = ctx
    return chains


def rows(A) -> list[Dist]:
    return [Dist.dense(r) for r in A]


def joint_counts(P, Q, gamma, rule, seed):
    """Counts of the first two emitted tokens over N runs of speculative rounds from token 0.
    Drafts are drawn in bulk; the rule under test runs once per round, as in the engine."""
    rng, gen = Rng(seed), np.random.default_rng(seed + 10_000)
    p_rows, q_rows = rows(P), rows(Q)
    first = np.full(N, -1)
    prev = np.zeros(N, dtype=np.int64)
    counts = np.zeros((V, V))
    todo = np.arange(N)
    while todo.size:
        chains = draft_chains(Q, prev[todo], gamma, gen)
        again = []
        for k, d in zip(todo, chains):
            ctxs = np.concatenate(([prev[k]], d))
            prows = [p_rows[c] for c in ctxs]
            if rule is None:
                v = one_hot_verify(prows, d, rng)
            else:
                v = rule(prows, [q_rows[c] for c in ctxs[:-1]], d, rng)
            emitted = [*d[:v.n_accepted].tolist(), v.token]
            if first[k] < 0:
                first[k] = emitted[0]
                if len(emitted) == 1:
                    prev[k] = emitted[0]
                    again.append(k)
                    continue
                emitted = emitted[1:]
            counts[first[k], emitted[0]] += 1
        todo = np.asarray(again, dtype=np.int64)
    return counts


def joint_pvalue(P, counts):
    expected = (P[0][:, None] * P) * counts.sum()
    mask = expected.ravel() > 0
    obs, exp = counts.ravel(), expected.ravel()
    assert obs[~mask].sum() == 0, "emitted a pair the target gives probability zero"
    return stats.chisquare(obs[mask], exp[mask]).pvalue


CASES = {
    "random": (chain(1), chain(2)),
    "close": (chain(3), 0.8 * chain(3) + 0.2 * chain(4)),
    # Draft mass entirely where the target has none for half the tokens.
    "disjoint": (
        np.tile(np.array([0.4, 0.3, 0.3, 0, 0, 0]), (V, 1)),
        np.tile(np.array([0, 0, 0.1, 0.3, 0.3, 0.3]), (V, 1)),
    ),
    # Truncated supports: top-k on the target, top-p on the draft, as the transform produces.
    "truncated": (
        np.stack([probabilities(r, SamplingParams(temperature=0.8, top_k=3)) for r in
                  np.random.default_rng(5).standard_normal((V, V)) * 2]),
        np.stack([probabilities(r, SamplingParams(temperature=0.8, top_p=0.7)) for r in
                  np.random.default_rng(6).standard_normal((V, V)) * 2]),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_rule_matches_target(case, gamma):
    P, Q = CASES[case]
    counts = joint_counts(P, Q, gamma, speculative_verify, seed=gamma)
    assert joint_pvalue(P, counts) > ALPHA


@pytest.mark.parametrize("gamma", [1, 3])
def test_one_hot_rule_matches_target(gamma):
    P, Q = CASES["random"]
    counts = joint_counts(P, Q, gamma, None, seed=11)
    assert joint_pvalue(P, counts) > ALPHA


@pytest.mark.parametrize("case", ["random", "disjoint", "truncated"])
def test_wrong_rule_is_caught(case):
    P, Q = CASES[case]
    counts = joint_counts(P, Q, 3, wrong_rule, seed=7)
    assert joint_pvalue(P, counts) < ALPHA


def test_residual_is_normalised_max_of_difference():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.5, 0.1, 0.2])
    np.testing.assert_allclose(residual(Dist.dense(p), Dist.dense(q)).to_dense(),
                               np.array([0.3, 0.0, 0.1, 0.0]) / 0.4)
    np.testing.assert_allclose(residual(Dist.dense(p), Dist.dense(p)).to_dense(), p)
    # On supports: the union of the two, whatever their sizes.
    sp, sq = Dist.sparse(4, [0, 1, 2], [0.5, 0.3, 0.2]), Dist.sparse(4, [0, 1, 2, 3], q)
    np.testing.assert_allclose(residual(sp, sq).to_dense(), np.array([0.3, 0.0, 0.1, 0.0]) / 0.4)
    np.testing.assert_allclose(residual(sp, Dist.dense(q)).to_dense(),
                               np.array([0.3, 0.0, 0.1, 0.0]) / 0.4)


def test_greedy_rule_keeps_prefix_matching_argmax():
    p = rows(np.eye(5)[[1, 2, 3, 4]])
    assert greedy_verify(p, np.array([1, 2, 3])) == Verdict(3, 4, "bonus")
    assert greedy_verify(p, np.array([1, 0, 3])) == Verdict(1, 2, "correction")
    assert greedy_verify(p, np.array([4, 2, 3])) == Verdict(0, 1, "correction")


def test_a_token_its_declared_q_cannot_give_is_refused():
    """Token 0 cannot have come from q = (0, 0, 1): no emission from the p/q rule would be
    exact for it (always taking the residual, the old branch, emits token 0 with probability
    0 here instead of 0.5), so verification refuses it."""
    p = np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.0, 0.0, 1.0]])
    with pytest.raises(DraftLawError, match="probability 0"):
        speculative_verify(rows(p), rows(q), np.array([0]), Rng(0))
