"""A separate small model as drafter: samples gamma tokens from q, one decode each.

The draft's own KV cache is kept in step with the committed text through its `Session.sync`:
after a round only the tokens it has not seen (the correction or bonus token, and the last
drafted token when everything was accepted) are fed before drafting again.

Drafting stops early once the product of the draft's probabilities of its own tokens (the chance,
by the draft's account, that the whole run so far is right; untempered when greedy) falls under
`chain_min`: past that point more tokens cost a draft decode each and are unlikely to be kept.
The draft's probability of its token predicts agreement closely (scripts/policy_sim.py trace of
the suite: 0.98-1.00 at q >= 0.9, 0.61 at 0.5-0.7, 0.22 under 0.3). Drafting also stops after an
end-of-generation token: nothing after it can be committed. Both stops read only the draft's own
tokens and numbers, so the verification stays exact.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from engine.backend import Backend
from engine.drafters.base import Proposal
from engine.errors import SettingsError
from engine.sampling import SamplingParams, probabilities, sample, top_probability
from engine.session import Session


class DraftModelDrafter:
    def __init__(self, backend: Backend, p_min: float = 0.0, chain_min: float = 0.0) -> None:
        if not (0.0 <= p_min < 1.0) or not (0.0 <= chain_min < 1.0):
            raise SettingsError(f"draft p-min and chain-min must be in [0, 1), got {p_min}, "
                                f"{chain_min}")
        self.name = "draft-model"
        self.session = Session(backend)
        # Stop drafting once the draft's probability of its own token drops under p_min
        # (llama.cpp's --draft-p-min; that token is dropped; untempered when greedy, as for
        # chain_min); 0 never stops early.
        self.p_min = p_min
        # Stop after the token that takes the run's product of probabilities under chain_min
        # (that token is kept: it is paid for, and the policy may still verify it).
        self.chain_min = chain_min
        # Batch width for catching up on committed tokens (padding, engine/widths.py); set from
        # the pair's calibration.
        self.widths: Callable[[int], int] | None = None

    def prefill(self, context: Sequence[int]) -> None:
        """Warm the draft's cache on the prompt (so the first round only pays for drafting)."""
        self.session.sync(context, feed_last=False)

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        t0 = time.perf_counter()
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        own: list[float] = []
        if gamma > 0:
            logits = self.session.sync(context, feed_last=True, widths=self.widths)
            assert logits is not None
            eog = self.session.backend.is_eog
            chain = 1.0
            for i in range(gamma):
                if params.greedy:
                    # q is one-hot at the argmax, which is what a proposal without q rows means;
                    # the untempered probability still says how sure the draft is.
                    x = int(np.argmax(logits[-1]))
                    sure = float(top_probability(logits[-1:])[0])
                else:
                    q = probabilities(logits[-1], params)
                    x = sample(q, rng)
                    sure = float(q[x])
                if self.p_min > 0.0 and i > 0 and sure < self.p_min:
                    break
                tokens.append(x)
                own.append(sure)
                if not params.greedy:
                    rows.append(q)
                chain *= sure
                if i + 1 < gamma and chain >= self.chain_min and not eog(x):
                    logits = self.session.extend([x])
                else:
                    break
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32),
                        q=np.stack(rows) if rows else None,
                        confidence=np.asarray(own, dtype=np.float64) if own else None,
                        time_ms=(time.perf_counter() - t0) * 1e3, source=self.name)
