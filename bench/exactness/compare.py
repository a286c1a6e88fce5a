"""Two-sample comparison of categorical outcomes: chi-square homogeneity test with rare
categories pooled, and total-variation distance with a bootstrap confidence interval.

Pooling: categories are kept, most frequent first, while the smaller sample expects at least
`min_expected` of them; the rest form one "other" category (merged into the last kept one
when it is itself too small), so the chi-square approximation holds. TV is computed on the
pooled categories. `tv_noise` is the 95th percentile of the TV between two samples of these
sizes drawn from one distribution (the pooled one): the TV that sampling noise alone gives.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq
from scipy.stats import chi2, chi2_contingency, ncx2

OTHER = "<other>"


@dataclass(frozen=True)
class Comparison:
    statistic: str
    n_a: int
    n_b: int
    categories: int
    chi2: float
    dof: int
    p_value: float
    tv: float
    tv_low: float
    tv_high: float
    tv_noise: float
    # Pooled category probabilities (both samples together), most frequent first.
    pooled: tuple[float, ...] = ()


def pooled_counts(a: Sequence[Hashable], b: Sequence[Hashable], min_expected: float = 5.0
                  ) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    ca, cb = Counter(a), Counter(b)
    n_small, n_total = min(len(a), len(b)), len(a) + len(b)
    ranked = sorted(set(ca) | set(cb), key=lambda k: (-(ca[k] + cb[k]), repr(k)))
    labels: list[str] = []
    rows_a: list[int] = []
    rows_b: list[int] = []
    other_a = other_b = 0
    for k in ranked:
        if (ca[k] + cb[k]) * n_small / n_total >= min_expected:
            labels.append(repr(k))
            rows_a.append(ca[k])
            rows_b.append(cb[k])
        else:
            other_a += ca[k]
            other_b += cb[k]
    if other_a + other_b:
        if (other_a + other_b) * n_small / n_total >= min_expected or not labels:
            labels.append(OTHER)
            rows_a.append(other_a)
            rows_b.append(other_b)
        else:
            labels[-1] += "+" + OTHER
            rows_a[-1] += other_a
            rows_b[-1] += other_b
    return labels, np.asarray(rows_a, dtype=np.int64), np.asarray(rows_b, dtype=np.int64)


def _tv(fa: npt.NDArray[np.float64], fb: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 0.5 * np.abs(fa - fb).sum(axis=-1)


def compare(a: Sequence[Hashable], b: Sequence[Hashable], statistic: str,
            rng: np.random.Generator, n_boot: int = 2000, min_expected: float = 5.0) -> Comparison:
    if not a or not b:
        raise ValueError("both samples must be non-empty")
    labels, ca, cb = pooled_counts(a, b, min_expected)
    n_a, n_b = int(ca.sum()), int(cb.sum())
    if len(labels) >= 2:
        chi2, p_value, dof, _ = chi2_contingency(np.vstack([ca, cb]), correction=False)
    else:
        chi2, p_value, dof = 0.0, 1.0, 0
    fa, fb = ca / n_a, cb / n_b
    boot = _tv(rng.multinomial(n_a, fa, size=n_boot) / n_a, rng.multinomial(n_b, fb, size=n_boot) / n_b)
    pooled = (ca + cb) / (n_a + n_b)
    null = _tv(rng.multinomial(n_a, pooled, size=n_boot) / n_a,
               rng.multinomial(n_b, pooled, size=n_boot) / n_b)
    low, high = np.percentile(boot, [2.5, 97.5])
    return Comparison(statistic=statistic, n_a=n_a, n_b=n_b, categories=len(labels),
                      chi2=float(chi2), dof=int(dof), p_value=float(p_value),
                      tv=float(_tv(fa, fb)), tv_low=float(low), tv_high=float(high),
                      tv_noise=float(np.percentile(null, 95)), pooled=tuple(pooled.tolist()))


def detectable_tv(c: Comparison, threshold: float, power: float = 0.8) -> float:
    """The smallest bias this comparison catches with `power` at `threshold`: mass moved
    between its two likeliest (pooled) categories, the kind of shift a draft-favouring bias
    makes. The chi-square statistic is then noncentral with noncentrality
    delta^2 (1/p1 + 1/p2) / (1/n_a + 1/n_b), and delta is that bias's total variation."""
    if c.dof < 1 or len(c.pooled) < 2:
        return 1.0
    crit = chi2.ppf(1.0 - threshold, c.dof)
    lam = brentq(lambda x: ncx2.sf(crit, c.dof, x) - power, 1e-9, 1e7)
    p1, p2 = sorted(c.pooled)[-2:]
    delta = np.sqrt(lam * (1.0 / c.n_a + 1.0 / c.n_b) / (1.0 / p1 + 1.0 / p2))
    return float(min(delta, 1.0))
