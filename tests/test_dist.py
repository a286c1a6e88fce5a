"""The fast representation of p and q: `distribution` (float32, on the support that truncation
leaves, no full sort) equals the float64 full-sort reference on random rows, on rows full of
ties at the top-k, top-p and min-p boundaries, and as the temperature goes to 0; a `Dist`'s
reads, draws and residuals equal the dense computation."""
from __future__ import annotations

import numpy as np
import pytest

from engine.dist import BLOCK, Dist
from engine.sampling import Rng, SamplingParams, distribution
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
    for t in (1e-3, 1e-5, 1e-8):
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
