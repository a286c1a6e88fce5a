"""The sampling transform as a plain float64 computation over the whole vocabulary, with a full
sort: the reference that `engine.transform.distribution` (float32, on supports, no full sort)
must agree with, ties at the truncation boundaries included (tests/test_dist.py)."""
from __future__ import annotations

import numpy as np

from engine.sampling import SamplingParams


def reference_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        out = np.zeros(logits.shape)
        out[int(np.argmax(logits))] = 1.0
        return out
    z = (logits - logits.max()) / params.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    keep = np.ones(probs.shape, dtype=bool)
    if params.top_k and params.top_k < probs.size:
        kth = np.sort(logits)[-params.top_k]
        keep &= logits >= kth
    if params.top_p < 1.0:
        masked = np.where(keep, probs, 0.0)
        ids = np.arange(probs.size)
        # Most likely first; among equal logits the lower id first.
        order = np.lexsort((ids, -np.where(keep, logits, -np.inf)))
        cum = np.cumsum(masked[order])
        n_keep = min(int(np.searchsorted(cum, params.top_p * masked.sum(), side="left")) + 1,
                     int(keep.sum()))
        nucleus = np.zeros(probs.size, dtype=bool)
        nucleus[order[:n_keep]] = True
        keep &= nucleus
    if params.min_p > 0.0:
        # The floor in the logits' own precision, float32, as the engine compares it.
        keep &= logits >= np.float32(logits.max() + params.temperature * np.log(params.min_p))
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()
