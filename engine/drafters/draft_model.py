"""A separate small model as drafter: samples gamma tokens from q, one decode each.

The draft's own KV cache is kept in step with the committed text through its `Session.sync`:
after a round only the tokens it has not seen (the correction or bonus token, and the last
drafted token when everything was accepted) are fed before drafting again.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from engine.backend import Backend
from engine.drafters.base import Proposal
from engine.sampling import SamplingParams, probabilities, sample
from engine.session import Session


class DraftModelDrafter:
    def __init__(self, backend: Backend, p_min: float = 0.0) -> None:
        self.name = "draft-model"
        self.session = Session(backend)
        # Stop drafting once the draft's probability of its own token drops under p_min
        # (llama.cpp's --draft-p-min); 0 never stops early.
        self.p_min = p_min

    def prefill(self, context: Sequence[int]) -> None:
        """Warm the draft's cache on the prompt (so the first round only pays for drafting)."""
        self.session.sync(context, feed_last=False)

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        t0 = time.perf_counter()
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        if gamma > 0:
            logits = self.session.sync(context, feed_last=True)
            assert logits is not None
            for i in range(gamma):
                q = probabilities(logits[-1], params)
                x = sample(q, rng)
                if self.p_min > 0.0 and i > 0 and q[x] < self.p_min:
                    break
                tokens.append(x)
                rows.append(q)
                if i + 1 < gamma:
                    logits = self.session.extend([x])
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32),
                        q=np.stack(rows) if rows else None,
                        time_ms=(time.perf_counter() - t0) * 1e3, source=self.name)
