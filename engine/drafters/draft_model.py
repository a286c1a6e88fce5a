"""A separate small model as drafter: samples gamma tokens from q, one decode each.

The draft's own KV cache is kept in step with the committed text through its `Session.sync`:
after a round only the tokens it has not seen (the correction or bonus token, and the last
drafted token when everything was accepted) are fed before drafting again.

Three stops end a round's draft early, each a stopping rule checked before the next token is
drawn (engine/drafters/base.py says why nothing else is exact):
- `chain_min`: once the product of the draft's probabilities of its tokens so far (untempered
  when greedy) falls under it, the run is unlikely to survive and more tokens would cost a draft
  decode each;
- `p_min` (llama.cpp's --draft-p-min): once the largest probability of the next row is under it;
- an end-of-generation token: nothing after it can be committed;
and the policy's `keep`, given the probabilities so far and the next row's largest one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from engine.backend import Backend
from engine.dist import Dist
from engine.drafters.base import Drafter, Keep, Proposal
from engine.round_plan import MODEL, RoundPlan
from engine.errors import SettingsError
from engine.confidence import top_probability
from engine.rng import Rng
from engine.sampling import GREEDY, SamplingParams
from engine.grammar.guide import Guide
from engine.grammar.mask import has_allowed_finite, masked_distribution, masked_top_probability
from engine.session import Session


class DraftModelDrafter(Drafter):
    # Always a model: the base class's optional session is this drafter's own.
    session: Session
    guided = True

    def __init__(self, backend: Backend, p_min: float = 0.0, chain_min: float = 0.0) -> None:
        if not (0.0 <= p_min < 1.0) or not (0.0 <= chain_min < 1.0):
            raise SettingsError(f"draft p-min and chain-min must be in [0, 1), got {p_min}, "
                                f"{chain_min}")
        self.name = "draft-model"
        self.session = Session(backend)
        # Stop drafting, after the first token, once the next row's largest probability is
        # under p_min (llama.cpp's --draft-p-min; untempered when greedy); 0 never stops.
        self.p_min = p_min
        # Stop after the token that takes the run's product of probabilities under chain_min
        # (that token is kept: it is paid for, and the policy may still verify it).
        self.chain_min = chain_min
        # Batch width for catching up on committed tokens (padding, engine/widths.py); set from
        # the pair's calibration through `pad_catch_up`.
        self._widths: Callable[[int], int] | None = None

    def pad_catch_up(self, widths: Callable[[int], int] | None) -> None:
        self._widths = widths

    def prefill(self, context: Sequence[int]) -> None:
        """Warm the draft's cache on the prompt (so the first round only pays for drafting)."""
        self.session.sync(context, feed_last=False)

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        # `behind`: what `Session.sync(context, feed_last=True)` feeds, at least the last token.
        # A model drafting greedily draws nothing: its draft is a function of the text.
        behind = len(context) - min(self.session.common_prefix(context), len(context) - 1)
        return RoundPlan(MODEL, self.name, behind=behind, samples=not params.greedy,
                         context=context)

    def reset(self) -> None:
        self.session.rollback(0)

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        """Under a grammar (`guide`), row i is masked by the state after x_0..x_{i-1}, the same
        state that masks the target's row i, and the draft stops where the grammar leaves it no
        token it can draw."""
        tokens: list[int] = []
        rows: list[Dist] = []
        own: list[float] = []
        sampled = plan.samples
        if gamma > 0:
            logits = self.session.sync(plan.context, feed_last=True, widths=self._widths)
            assert logits is not None
            eog = self.session.backend.is_eog
            chain = 1.0
            for i in range(gamma):
                # Everything up to the draw reads only the row, never the token it gives.
                mask = None if guide is None else guide.mask()
                if mask is not None and not has_allowed_finite(logits[-1], mask):
                    break
                if not sampled:
                    # q is one-hot at the argmax, which is what a proposal without q rows means;
                    # the untempered probability still says how sure the draft is.
                    q = None
                    sure = (float(top_probability(logits[-1:])[0]) if mask is None
                            else masked_top_probability(logits[-1], mask))
                else:
                    q = masked_distribution(logits[-1], params, mask)
                    sure = q.max_prob()
                if i > 0 and sure < self.p_min:
                    break
                if keep is not None and not keep(own, sure):
                    break
                if q is None:
                    x = (int(np.argmax(logits[-1])) if mask is None
                         else masked_distribution(logits[-1], GREEDY, mask).argmax())
                    own.append(sure)
                else:
                    x = rng.draw(q)
                    # A statistic for the stops, not the rule: a lazy row's estimate will do.
                    own.append(q.prob_estimate(x))
                    rows.append(q)
                tokens.append(x)
                if guide is not None:
                    guide.push(x)
                chain *= own[-1]
                if i + 1 == gamma or chain < self.chain_min or eog(x):
                    break
                logits = self.session.extend([x])
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32),
                        q=rows or None, source=self.name)
