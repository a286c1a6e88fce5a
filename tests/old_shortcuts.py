"""The two draft cuts that once biased sampled output, kept as negative controls: each decided
whether to verify a drafted token from that token's own probability q(x). The exactness checks
must catch them (tests/test_exactness_enumeration.py, tests/test_exactness_default_path.py)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from engine.drafters.base import Drafter, Keep, Proposal
from engine.drafters.draft_model import DraftModelDrafter
from engine.transform import distribution


class OldTrim(Drafter):
    """The trim as it was: draft the whole run, then keep the prefix whose expected accepted
    tokens, counting each drafted token's own q(x) as its chance, best pay their verify width."""

    def __init__(self, inner: DraftModelDrafter, verify_ms: Sequence[float]) -> None:
        self.name = inner.name
        self.inner = inner
        self.verify_ms = list(verify_ms)

    def prefill(self, context: Sequence[int]) -> None:
        self.inner.prefill(context)

    def samples(self, context, params) -> bool:
        return self.inner.samples(context, params)

    def propose(self, context, gamma, params, rng, keep: Keep | None = None) -> Proposal:
        p = self.inner.propose(context, gamma, params, rng)
        if p.q is None or not len(p):
            return p
        own = [q.prob(int(x)) for q, x in zip(p.q, p.tokens)]
        best_k, best, expected, chain = 0, 0.0, 0.0, 1.0
        for k, q in enumerate(own, start=1):
            chain *= float(q)
            expected += chain
            gain = expected - (self.verify_ms[k] - self.verify_ms[0]) / self.verify_ms[0]
            if gain > best:
                best_k, best = k, gain
        return replace(p, tokens=p.tokens[:best_k], q=p.q[:best_k] if best_k else None)


class OldPMin(DraftModelDrafter):
    """p-min as it was under sampling: draw x, then drop it (and stop) when q(x) < p_min."""

    def propose(self, context, gamma, params, rng, keep: Keep | None = None) -> Proposal:
        tokens, rows = [], []
        logits = self.session.sync(context, feed_last=True)
        for i in range(gamma):
            q = distribution(logits[-1], params)
            x = rng.draw(q)
            if i > 0 and q.prob(x) < self.p_min:
                break
            tokens.append(x)
            rows.append(q)
            if i + 1 < gamma:
                logits = self.session.extend([x])
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32),
                        q=rows or None, source=self.name)
