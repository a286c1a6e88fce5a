"""Token masks and masked rows (engine/grammar/mask.py): the bitmask's layout, and the two
representations of a masked row (the allowed tokens alone, or the whole row with -inf outside)
giving the same distribution, ties at top-k and top-p boundaries included."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import GrammarError
from engine.grammar import mask as grammar_mask
from engine.grammar.mask import TokenMask, has_allowed_finite, masked_distribution
from engine.sampling import SamplingParams
from engine.transform import probabilities


def test_the_mask_reads_llguidances_layout():
    # Bit j of word i allows token 32 i + j.
    words = np.array([1 << 5, 1 << 0], dtype=np.uint32)
    m = TokenMask(40, words)
    assert m.ids().tolist() == [5, 32] and m.count == 2 and m.single is None
    assert m.allows(32) and not m.allows(6) and not m.allows(-1) and not m.allows(40)
    assert m.dense().nonzero()[0].tolist() == [5, 32]


def test_bits_past_the_vocabulary_never_count():
    m = TokenMask(36, np.array([0, 0xFFFFFFFF], dtype=np.uint32))
    assert m.ids().tolist() == [32, 33, 34, 35] and m.count == 4


def test_one_allowed_token_is_forced():
    assert TokenMask.of(64, [17]).single == 17
    assert TokenMask.of(64, []).single is None


SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
            SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=1.0, min_p=0.2),
            SamplingParams(temperature=0.0)]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_both_representations_give_the_masked_rows_law(params, monkeypatch):
    """On rows rounded to a grid (ties everywhere, at the top-k and top-p edges too), the
    masked row is the transform of the row with -inf outside the mask, whichever path runs."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(8, 80))
        row = (np.round(rng.standard_normal(n) * 2) / 2).astype(np.float32)
        allowed = np.flatnonzero(rng.random(n) < 0.4)
        if allowed.size == 0:
            continue
        mask = TokenMask.of(n, allowed)
        want = probabilities(np.where(mask.dense(), row, -np.inf).astype(np.float32), params)
        for share in (0.0, 1.0):
            monkeypatch.setattr(grammar_mask, "SPARSE_SHARE", share)
            got = masked_distribution(row, params, mask).to_dense()
            np.testing.assert_allclose(got, want, atol=1e-12)
            assert got[~mask.dense()].sum() == 0


def test_a_lazy_row_under_a_wide_mask_stays_exact():
    """At 151,936 tokens, a mask allowing most of them takes the dense path and the lazy
    softmax; the masked-out tokens have probability 0 and the rest their renormalised share."""
    rng = np.random.default_rng(1)
    row = rng.standard_normal(151_936).astype(np.float32) * 3
    allowed = np.flatnonzero(rng.random(row.size) < 0.9)
    mask = TokenMask.of(row.size, allowed)
    d = masked_distribution(row, SamplingParams(temperature=1.0), mask)
    e = np.exp(row.astype(np.float64) - row.max()) * mask.dense()
    x = int(allowed[np.argmax(row[allowed])])
    assert d.prob(x) == pytest.approx(e[x] / e.sum(), rel=1e-5)
    banned = int(np.flatnonzero(~mask.dense())[0])
    assert d.prob(banned) == 0.0


def test_a_draft_with_no_allowed_finite_logit_is_seen():
    row = np.array([0.0, -np.inf, -np.inf, 1.0], dtype=np.float32)
    assert not has_allowed_finite(row, TokenMask.of(4, [1, 2]))
    assert has_allowed_finite(row, TokenMask.of(4, [2, 3]))


def test_an_empty_mask_is_an_error_not_a_nan():
    with pytest.raises(GrammarError, match="allows no token"):
        masked_distribution(np.zeros(8, dtype=np.float32), SamplingParams(), TokenMask.of(8, []))


@pytest.mark.parametrize("share", [0.001, 0.9])
def test_a_greedy_drafts_confidence_under_a_mask_is_the_masked_rows(share):
    """The statistic a greedy draft's stops read: the masked row's top probability at T = 1,
    estimated without exponentiating the far tail (within 0.1%, as engine/confidence.py's)."""
    from engine.grammar.mask import masked_top_probability
    rng = np.random.default_rng(2)
    row = (rng.standard_normal(151_936) * 2).astype(np.float32)
    row[rng.integers(0, row.size, 20)] += 12
    mask = TokenMask.of(row.size, np.flatnonzero(rng.random(row.size) < share))
    exact = masked_distribution(row, SamplingParams(temperature=1.0), mask).max_prob()
    assert masked_top_probability(row, mask) == pytest.approx(exact, rel=1e-3)
