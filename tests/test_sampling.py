"""The logits-to-probabilities transform and the validation of settings."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import SettingsError
from engine.dist import Dist
from engine.confidence import top_probability
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import Rows, probabilities

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], dtype=np.float32))


def test_greedy_is_one_hot_at_argmax():
    p = probabilities(LOGITS, SamplingParams(temperature=0.0))
    assert p.tolist() == [0, 1, 0, 0, 0]


def test_top_probability_is_the_softmax_maximum_per_row_whatever_the_scale():
    rows = np.stack([LOGITS, LOGITS + 1000.0, np.array([0, 0, 0, 0, 50], dtype=np.float32)])
    np.testing.assert_allclose(top_probability(rows), [0.4, 0.4, 1.0], rtol=1e-4)
    assert top_probability(LOGITS) == pytest.approx(0.4)


def test_temperature_one_is_softmax():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p, [0.05, 0.4, 0.1, 0.3, 0.15], rtol=1e-6)


def test_top_k_keeps_k_most_likely():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p, [0, 0.4 / 0.7, 0, 0.3 / 0.7, 0], rtol=1e-6)


def test_top_p_keeps_smallest_prefix_reaching_mass():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.75))
    # 0.4 + 0.3 = 0.7 < 0.75, so 0.15 crosses the line and stays.
    np.testing.assert_allclose(p, np.array([0, 0.4, 0, 0.3, 0.15]) / 0.85, rtol=1e-6)


def test_top_p_on_a_large_vocabulary_matches_a_full_sort():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50000).astype(np.float32) * 0.5
    params = SamplingParams(temperature=1.0, top_p=0.9)
    p = probabilities(logits, params)
    full = np.exp(logits - logits.max()).astype(np.float64)
    full /= full.sum()
    order = np.argsort(-full, kind="stable")
    n = int(np.searchsorted(np.cumsum(full[order]), 0.9)) + 1
    assert set(np.flatnonzero(p)) == set(order[:n].tolist())


def test_min_p_drops_tokens_below_fraction_of_max():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))
    # threshold 0.12: keeps 0.4, 0.3, 0.15
    np.testing.assert_allclose(p, np.array([0, 0.4, 0, 0.3, 0.15]) / 0.85, rtol=1e-6)


def test_rows_are_lazy_and_equal_to_direct_transform():
    logits = np.stack([LOGITS, LOGITS[::-1]])
    params = SamplingParams(temperature=0.7, top_k=3)
    rows = Rows(logits, params)
    np.testing.assert_allclose(rows[1].to_dense(), probabilities(logits[1], params))
    assert len(rows._rows) == 1


def test_sample_follows_distribution():
    rng = Rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([rng.draw(Dist.dense(p)) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(draws, p, atol=0.015)
    assert draws[1] == 0


@pytest.mark.parametrize("kwargs, word", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top-p"),
    ({"top_p": 1.5}, "top-p"),
    ({"top_k": -1}, "top-k"),
    ({"min_p": 1.0}, "min-p"),
])
def test_bad_settings_are_refused(kwargs, word):
    with pytest.raises(SettingsError, match=word):
        SamplingParams(**kwargs)
