"""The two-sample statistics: pooling, chi-square and total variation with intervals."""
from __future__ import annotations

import numpy as np
import pytest

from engine.exactness.compare import OTHER, compare, pooled_counts
from engine.exactness.draws import first_two, line_length


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
    tb = {1: b"a", 2: b"b\n", 3: b"\n"}.__getitem__
    assert line_length((1, 1, 2, 1), tb, cap=12) == 3
    assert line_length((3,), tb, cap=12) == 1
    assert line_length((1, 1), tb, cap=12) == 2  # ended without a newline
    assert line_length((1,) * 20, tb, cap=12) == 12
    assert first_two((5,)) == (5, -1) and first_two(()) == (-1, -1)
