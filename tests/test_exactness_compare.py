"""The two-sample statistics: pooling, chi-square and total variation with intervals."""
from __future__ import annotations

import numpy as np
import pytest

from bench.exactness.compare import OTHER, compare, detectable_tv, pooled_counts
from bench.exactness.draws import END, pair_at, statistics


def test_pooling_keeps_frequent_categories_and_pools_the_rare_ones():
    a = ["x"] * 50 + ["y"] * 30 + ["r1", "r2", "r3"] * 3 + ["z"] * 11
    b = ["x"] * 48 + ["y"] * 32 + ["r4"] * 2 + ["z"] * 18
    labels, ca, cb = pooled_counts(a, b)
    assert labels[:3] == ["'x'", "'y'", "'z'"]
    assert labels[-1] == OTHER
    assert ca.sum() == len(a) and cb.sum() == len(b)
    assert (ca[-1], cb[-1]) == (9, 2)


def test_a_too_small_other_bucket_joins_the_last_kept_category():
    a = ["x"] * 40 + ["y"] * 40 + ["r"]
    b = ["x"] * 40 + ["y"] * 40 + ["s"]
    labels, ca, cb = pooled_counts(a, b)
    assert labels == ["'x'", "'y'+" + OTHER] and list(ca) == [40, 41]


def test_same_distribution_passes_and_shifted_distribution_fails():
    rng = np.random.default_rng(1)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.3, 0.3, 0.25, 0.15])
    a = list(rng.choice(4, 2000, p=p))
    b = list(rng.choice(4, 2000, p=p))
    c = list(rng.choice(4, 2000, p=q))
    same = compare(a, b, "s", np.random.default_rng(0))
    diff = compare(a, c, "s", np.random.default_rng(0))
    assert same.p_value > 0.01 and diff.p_value < 1e-6
    assert same.dof == 3 and same.categories == 4
    # TV(p, q) = 0.1: the interval of the shifted pair covers it, the same pair sits at noise level.
    assert diff.tv_low < 0.1 < diff.tv_high
    assert same.tv < same.tv_noise * 1.5 and diff.tv > diff.tv_noise


def test_a_single_category_cannot_be_tested_and_counts_as_agreement():
    r = compare([7] * 30, [7] * 40, "s", np.random.default_rng(0))
    assert (r.p_value, r.dof, r.tv) == (1.0, 0, 0.0)


def test_empty_sample_is_an_error():
    with pytest.raises(ValueError):
        compare([], [1], "s", np.random.default_rng(0))


def test_sequence_statistics():
    assert pair_at((5, 6, 7), 0, before=9) == (9, 5)
    assert pair_at((5, 6, 7), 2, before=9) == (6, 7)
    # Past the end of an answer: END.
    assert pair_at((5,), 1, before=9) == (5, END) and pair_at((5,), 3, before=9) == (END, END)
    stats = statistics([(1, 2, 3), (1, 4)], range(1, 3), before=0)
    assert stats == {"tokens 0,1": [(1, 2), (1, 4)], "tokens 1,2": [(2, 3), (4, END)]}


def test_the_detectable_bias_is_what_the_test_catches_four_times_in_five():
    """Simulate the bias detectable_tv names (mass moved between the two likeliest categories)
    at the same sample sizes: the test catches it about 80% of the time, and half that bias
    far less often."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    n, threshold = 1000, 0.01
    rng = np.random.default_rng(3)
    c = compare(list(rng.choice(4, n, p=p)), list(rng.choice(4, n, p=p)), "s", rng)
    d = detectable_tv(c, threshold)
    assert 0.03 < d < 0.1

    def caught(delta: float) -> float:
        q = p + np.array([delta, -delta, 0, 0])
        hits = 0
        for _ in range(300):
            r = compare(list(rng.choice(4, n, p=p)), list(rng.choice(4, n, p=q)), "s", rng,
                        n_boot=10)
            hits += r.p_value < threshold
        return hits / 300

    assert 0.7 < caught(d) < 0.9
    assert caught(d / 2) < 0.4
