"""The fast representation of p and q: `distribution` (float32, on the support that truncation
leaves, no full sort) equals the float64 full-sort reference on random rows, on rows full of
ties at the top-k, top-p and min-p boundaries, and as the temperature goes to 0; a `Dist`'s
reads, draws and residuals equal the dense computation."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from engine import transform
from engine.dist import BLOCK, Dist
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import distribution
from tests.reference_sampling import reference_probabilities

QWEN_VOCAB = 151_936

SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.3, min_p=0.1),
    SamplingParams(temperature=0.5, top_p=0.5, min_p=0.2),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.6),
    SamplingParams(temperature=1e-4, top_p=0.9),
    SamplingParams(temperature=1e-6),
    SamplingParams(temperature=0.0),
]


def llm_like_row(rng: np.random.Generator, n: int, peak: float) -> np.ndarray:
    """A bulk of unlikely tokens and a few plausible ones `peak` nats above it."""
    row = rng.standard_normal(n).astype(np.float32) * 2.0
    top = rng.choice(n, size=min(n, 12), replace=False)
    row[top] += peak + rng.exponential(1.5, size=top.size).astype(np.float32)
    return row


def assert_same(row: np.ndarray, params: SamplingParams) -> None:
    got = distribution(row, params).to_dense()
    want = reference_probabilities(row, params)
    assert np.array_equal(got > 0, want > 0), (
        f"support differs: {np.flatnonzero(got > 0)[:20]} vs {np.flatnonzero(want > 0)[:20]}")
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_random_rows_equal_the_reference(params):
    rng = np.random.default_rng(0)
    for n, peak in ((8, 0.0), (64, 3.0), (5000, 8.0), (QWEN_VOCAB, 10.0)):
        for _ in range(3 if n < QWEN_VOCAB else 1):
            assert_same(llm_like_row(rng, n, peak), params)


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_rows_with_ties_at_every_boundary_equal_the_reference(params):
    """Logits on a coarse grid: the k-th largest, the nucleus's last token and the min-p floor
    are shared by several tokens, and only a full sort with ids as tie-break says which stay."""
    rng = np.random.default_rng(1)
    for n in (8, 40, 3000):
        for _ in range(20):
            row = np.round(rng.standard_normal(n) * 2).astype(np.float32)
            assert_same(row, params)
    # The min-p floor exactly on a logit: exp((l - m) / t) == min_p at l = m + t log(min_p).
    t = 1.0
    row = np.array([0.0, np.log(0.25), np.log(0.25), -5.0], dtype=np.float32)
    assert_same(row, SamplingParams(temperature=t, min_p=float(np.exp(np.float32(np.log(0.25))))))


def test_the_support_is_what_truncation_leaves_not_the_vocabulary():
    row = llm_like_row(np.random.default_rng(2), QWEN_VOCAB, 12.0)
    d = distribution(row, SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05))
    assert d.ids is not None and len(d) <= 40
    assert distribution(row, SamplingParams(temperature=1.0)).ids is None


def test_temperature_towards_zero_is_greedy():
    row = llm_like_row(np.random.default_rng(3), 5000, 6.0)
    for t in (1e-3, 1e-5, 1e-8, 1e-40, 1e-300):
        d = distribution(row, SamplingParams(temperature=t))
        assert d.argmax() == int(np.argmax(row)) and d.max_prob() == pytest.approx(1.0)


def test_reads_equal_the_dense_row():
    rng = np.random.default_rng(4)
    dense = rng.random(50) * (rng.random(50) < 0.3)
    ids = np.flatnonzero(dense)
    for d in (Dist.dense(dense), Dist.sparse(50, ids[::-1], dense[ids[::-1]])):
        np.testing.assert_allclose(d.to_dense(), dense / dense.sum())
        for x in range(50):
            assert d.prob(x) == pytest.approx(dense[x] / dense.sum())
        assert d.argmax() == int(np.argmax(dense))
        np.testing.assert_allclose(d.probs_at(np.arange(50)), dense / dense.sum())
        np.testing.assert_allclose(d.without(int(ids[0])).to_dense(),
                                   np.where(np.arange(50) == ids[0], 0, dense)
                                   / (dense.sum() - dense[ids[0]]))


@pytest.mark.parametrize("n", [7, 4 * BLOCK + 1, 10 * BLOCK + 13])
def test_the_draw_is_the_inverse_cdf_of_the_row(n):
    """Block sums, then one block: the same token as a full cumulative sum at every quantile,
    and never a token of probability zero (zeros at the start, the end and inside blocks)."""
    rng = np.random.default_rng(5)
    w = (rng.random(n) * (rng.random(n) < 0.5)).astype(np.float32)
    w[:3] = 0
    w[-3:] = 0
    w[n // 2] = 1.0
    d = Dist.dense(w)
    cdf = np.cumsum(w, dtype=np.float64)
    for u in np.concatenate([rng.random(300), [0.0, 1 - 1e-16]]):
        x = d.inverse_cdf(float(u))
        assert w[x] > 0
        want = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), n - 1)
        if w[want] > 0 and abs(u * cdf[-1] - cdf[want]) > 1e-3 * cdf[-1] / n:
            assert x == want


def test_draws_follow_a_sparse_row():
    d = Dist.sparse(1000, [999, 3, 500], [0.3, 0.1, 0.6])
    rng = Rng(0)
    counts = np.bincount([rng.draw(d) for _ in range(20000)], minlength=1000)
    assert set(np.flatnonzero(counts)) == {3, 500, 999}
    np.testing.assert_allclose(counts[[3, 500, 999]] / 20000, [0.1, 0.6, 0.3], atol=0.015)


# --- lazy rows: only the tokens near the top exponentiated --------------------------------------

@pytest.mark.parametrize("tail_nats", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("params", SETTINGS[:3] + SETTINGS[5:8], ids=str)
def test_rows_with_a_tail_equal_the_reference(params, tail_nats, monkeypatch):
    """A low TAIL_NATS (and LAZY_FROM 0) puts most of a small row in the bounded tail: the
    nucleus is still settled exactly (from bounds, or by exponentiating the row when they leave it open)."""
    monkeypatch.setattr(transform, "TAIL_NATS", tail_nats)
    monkeypatch.setattr(transform, "LAZY_FROM", 0)
    rng = np.random.default_rng(7)
    for n in (8, 64, 3000):
        for _ in range(10):
            assert_same(np.round(rng.standard_normal(n) * 2, 1).astype(np.float32), params)
            assert_same(llm_like_row(rng, n, 4.0), params)


def lazy_row(n: int = 12, tail_nats: float = 0.7, seed: int = 8, t: float = 1.0) -> tuple:
    logits = (np.random.default_rng(seed).standard_normal(n) * 1.5).astype(np.float32)
    m = float(logits.max())
    d = Dist.softmax(logits, m, 1.0 / t, tail_nats)
    assert d.lazy, "the case must leave a tail"
    return d, reference_probabilities(logits, SamplingParams(temperature=t))


def chi_square_p(draws: list[int], law: np.ndarray) -> float:
    counts = np.bincount(draws, minlength=law.size)
    if counts[law == 0].sum():
        return 0.0  # a token the law gives probability zero
    keep = law > 0
    return float(stats.chisquare(counts[keep], law[keep] * len(draws)).pvalue)


def test_a_lazy_row_reads_exactly_and_bounds_what_it_has_not_exponentiated():
    d, want = lazy_row()
    for x in range(want.size):
        lo, hi = d.prob_bounds(x)
        assert lo <= want[x] * (1 + 1e-6) and want[x] <= hi * (1 + 1e-6)
    assert d.argmax() == int(np.argmax(want))
    assert d.prob_estimate(int(np.argmax(want))) == pytest.approx(want.max(), rel=0.05)
    assert d.lazy
    assert d.prob(3) == pytest.approx(want[3], rel=1e-6) and not d.lazy
    np.testing.assert_allclose(d.to_dense(), want, rtol=1e-6)


@pytest.mark.parametrize("t", [1.0, 0.6])
def test_a_lazy_rows_draws_by_rejection_follow_its_law(t):
    d, want = lazy_row(t=t)
    rng = Rng(1)
    draws = [rng.draw(d) for _ in range(30_000)]
    assert d.lazy, "drawing exponentiated the whole row"
    assert chi_square_p(draws, want) > 1e-3


def test_the_bounded_coin_and_the_residual_shortcuts_have_the_exact_laws():
    """`coin_bounded`, `draw_residual` and `draw_without` against the laws they stand for;
    exact enumeration (tests/exact_law.py) substitutes exactly those laws."""
    p, p_law = lazy_row(seed=9)
    q, q_law = lazy_row(seed=10)
    rng = Rng(2)
    n = 30_000
    heads = sum(rng.coin_bounded(0.2, 0.5, lambda: 0.35) for _ in range(n))
    assert heads / n == pytest.approx(0.35, abs=0.01)
    r = np.maximum(p_law - q_law, 0)
    assert chi_square_p([rng.draw_residual(p, q) for _ in range(n)], r / r.sum()) > 1e-3
    x = int(np.argmax(p_law))
    w = np.where(np.arange(p_law.size) == x, 0, p_law)
    assert chi_square_p([rng.draw_without(p, x) for _ in range(n)], w / w.sum()) > 1e-3


def test_a_wrong_residual_is_caught_by_the_same_check():
    """Negative control: drawing from p instead of the residual fails the same comparison."""
    p, p_law = lazy_row(seed=9)
    q, q_law = lazy_row(seed=10)
    rng = Rng(3)
    r = np.maximum(p_law - q_law, 0)
    assert chi_square_p([rng.draw(p) for _ in range(30_000)], r / r.sum()) < 1e-3
