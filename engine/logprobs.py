"""Log probabilities of committed tokens, as the OpenAI API reports them: the target model's own
distribution (log-softmax of its logits at temperature 1, before sampling settings and any
grammar), with the `top` most likely alternatives. Computed only when a request asks: it
exponentiates the whole row."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

# The most alternatives a request may ask for per token (OpenAI's top_logprobs limit).
MAX_TOP = 20


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    # The most likely tokens at the position, most likely first: (token, logprob).
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(row: F32, token: int, top: int) -> TokenLogprob:
    """`token`'s log probability under softmax(row), with the `top` most likely alternatives.

    >>> lp = token_logprob(np.log(np.array([0.5, 0.25, 0.25], dtype=np.float32)), 1, 1)
    >>> round(lp.logprob, 4), lp.top[0][0]
    (-1.3863, 0)
    """
    z = np.asarray(row, dtype=np.float32)
    m = float(z.max())
    lse = m + float(np.log(np.exp(z - np.float32(m)).sum(dtype=np.float64)))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, z.size)
        ids = np.argpartition(z, z.size - k)[z.size - k:]
        ids = ids[np.lexsort((ids, -z[ids]))]
        best = tuple((int(i), float(z[i]) - lse) for i in ids)
    return TokenLogprob(int(token), float(z[token]) - lse, best)
