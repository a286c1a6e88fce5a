"""The overhead runs' rows and text: banks of logit rows shaped like an LLM's, and a text in which
every pair of letters occurs (the losing-copies prompt)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

# The embedded Qwen2.5 target's vocabulary: the rows' length unless told otherwise.
QWEN_VOCAB = 151_936
BANK = 64


def llm_like_bank(n_vocab: int, seed: int, slots: int = BANK,
                  tops: Sequence[int] | None = None) -> np.ndarray:
    """`[slots, n_vocab]` float32 rows: N(-4, 2.5) logits, a top token at 16-23 and fifteen
    runners-up below it by Exp(2.5) nats; with `tops` (sixteen ids), those are the sixteen,
    in an order of each row's own."""
    rng = np.random.default_rng(seed)
    bank = rng.standard_normal((slots, n_vocab), dtype=np.float32) * 2.5 - 4.0
    for row in bank:
        top = (rng.choice(n_vocab, size=16, replace=False) if tops is None
               else rng.permutation(np.asarray(tops)))
        m = rng.uniform(16.0, 23.0)
        row[top] = m - np.concatenate([[0.0], rng.exponential(2.5, size=15)])
    return bank


def pairs_text(letters: str) -> str:
    """A de Bruijn sequence of order 2 over `letters`: every ordered pair of them (a letter
    twice included) occurs once, in len(letters) ** 2 + 1 letters.

    >>> pairs_text("ab")
    'aabba'
    """
    k = len(letters)
    seq: list[int] = []
    a = [0] * 3

    def db(t: int, p: int) -> None:
        if t > 2:
            if 2 % p == 0:
                seq.extend(a[1:p + 1])
            return
        a[t] = a[t - p]
        db(t + 1, p)
        for j in range(a[t - p] + 1, k):
            a[t] = j
            db(t + 1, t)

    db(1, 1)
    return "".join(letters[i] for i in seq) + letters[0]
