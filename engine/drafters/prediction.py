"""Predicted outputs: draft by copying the answer a client expects (OpenAI's `prediction`), in
front of any other drafter.

A generation given a prediction (its tokens) drafts from it first: the committed text's end is
matched against the prediction the way prompt lookup matches the context (the same `NgramIndex`,
engine/drafters/prompt_lookup.py), and what followed the match in the prediction is the copy.
The prediction is indexed after the prompt's last `LEAD` tokens, so the answer's first round
matches the prompt's end and copies the prediction from its first token; once the answer departs
from the prediction (an edit), copying resumes where the answer's latest n tokens occur in it
again. Among several occurrences the copy comes from the one that agrees with the text furthest
back, then the one nearest the answer's own position (a file is rewritten in order). Where the
prediction has no match the drafter it wraps plans the round (hybrid: its copy from the context
or the history, else the model). Tokens carry no probabilities: the target verifies them with the
one-hot rule, so the output is exactly the target's. The copy drafts the renames the answer has
made to the prediction (engine/drafters/substitutions.py: the answer aligned against the
prediction as it is committed; a learnt S -> A is drafted as A where the copy holds S).

The plan is a function of the committed text (the prompt included) and the prediction alone,
which is what an exact decision may read (docs/EXACTNESS.md).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Sequence

import numpy as np

from engine.drafters.base import Drafter, Keep, Proposal, empty_proposal
from engine.drafters.history_index import MATCH_MAX, HistoryIndex
from engine.drafters.prompt_lookup import NgramIndex
from engine.drafters.substitutions import SPAN_MAX, Alignment
from engine.grammar.guide import Guide
from engine.rng import Rng
from engine.round_plan import PREDICTION, RoundPlan
from engine.sampling import SamplingParams

# The drafting part's name in reports and in the statistics (RoundStats.source, which
# GenerationStats counts the prediction's tokens by): the source's own word.
PREDICTION_DRAFTER = PREDICTION
# The n-gram of the text's end looked up in the prediction: 3, as prompt lookup's default; a
# shorter one would claim a match almost everywhere and keep the wrapped drafter from drafting.
PREDICTION_NGRAM = 3
# The most a prediction's copy offers a round (the round takes what its gamma allows).
PREDICTION_MAX_DRAFT = 64
# Tokens of the prompt's end indexed before the prediction: the first round's match.
LEAD = MATCH_MAX
# Occurrences of the text's end compared per round, those nearest the answer's position: a
# bound on a round's work where the n-gram is common (indentation in code).
NEAREST = 64


class PredictionDrafter(Drafter):
    """`inner` (any drafter) with the prediction in front of it, for one generation."""

    def __init__(self, inner: Drafter, prediction: Sequence[int], prompt: Sequence[int],
                 ngram: int = PREDICTION_NGRAM, max_draft: int = PREDICTION_MAX_DRAFT) -> None:
        self.inner = inner
        self.name = inner.name
        self.session = inner.session
        self.guided = inner.guided
        self.uses_history = inner.uses_history
        self.ngram = ngram
        self.max_draft = max_draft
        self.prediction = tuple(int(t) for t in prediction)
        self._prompt = prompt
        self._lead = tuple(int(t) for t in prompt[max(0, len(prompt) - LEAD):])
        self._text = [*self._lead, *self.prediction]
        self._index = NgramIndex(self._text, range(ngram, ngram + 1))
        self._index.update()
        self._alignment: Alignment | None = None

    def with_history(self, history: HistoryIndex) -> "PredictionDrafter":
        return PredictionDrafter(self.inner.with_history(history), self.prediction,
                                 self._prompt, self.ngram, self.max_draft)

    @property
    def model_name(self) -> str | None:
        return self.inner.model_name

    def match(self, context: Sequence[int]) -> tuple[int, int]:
        """(start, match): where in the indexed text (lead and prediction) the copy starts,
        and how many tokens of the context's end agree before it (up to MATCH_MAX, the lead
        counted for the n-gram only); match 0 when the prediction has no occurrence of the
        context's last n tokens."""
        n = self.ngram
        if len(context) < n:
            return 0, 0
        hits = self._index.starts(n, context)
        # Copies come from the prediction itself: a match that ends in the lead is the
        # prompt's own text (lookup's business), not the prediction's.
        lo = bisect_left(hits, len(self._lead) - n)
        # The answer's position in the indexed text, to rank occurrences that agree as far.
        here = len(self._lead) + len(context) - len(self._prompt)
        mid = bisect_left(hits, here - n, lo)
        near = hits[max(lo, mid - NEAREST // 2):mid + NEAREST // 2]
        best_start, best_match, best_gap = 0, 0, 0
        text = self._text
        # The lead agrees with the prompt's end by construction: it counts for the n-gram only,
        # so that a match's length says how far the answer has followed the prediction (the
        # controller keeps its evidence per length: a first round that misses, an answer that
        # opens with a code fence, is not evidence against long copies).
        floor = len(self._lead) - n
        for hit in near:
            start = hit + n
            m, i, j = n, hit - 1, len(context) - n - 1
            while m < MATCH_MAX and i >= floor and text[i] == context[j]:
                m, i, j = m + 1, i - 1, j - 1
            gap = abs(start - here)
            if m > best_match or (m == best_match and gap < best_gap):
                best_start, best_match, best_gap = start, m, gap
        return best_start, best_match

    def _aligned(self, context: Sequence[int]) -> Alignment:
        """The answer's alignment against the prediction, fed up to `context`'s end (a new
        one for another list)."""
        alignment = self._alignment
        if alignment is None or alignment.text is not context:
            alignment = self._alignment = Alignment(self._text, context, len(self._prompt),
                                                    lambda i: self._locate(context, i))
        alignment.update()
        return alignment

    def _locate(self, context: Sequence[int], i: int) -> int:
        """Where in the prediction a lost answer follows after its token i: after the
        occurrence of the n-gram ending at i nearest the answer's position, or -1."""
        n = self.ngram
        hits = self._index.occurrences(n, tuple(int(t) for t in context[i + 1 - n:i + 1]))
        lo = bisect_left(hits, len(self._lead) - n)
        if lo == len(hits):
            return -1
        here = len(self._lead) + i + 1 - len(self._prompt) - n
        mid = bisect_left(hits, here, lo)
        near = hits[max(lo, mid - 1):mid + 1]
        return min(near, key=lambda h: abs(h - here)) + n

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        start, match = self.match(context)
        subs = self._aligned(context).substitutions
        if match and subs.pairs:
            text = self._text
            tokens = tuple(subs.rewrite(text, start, min(len(text), start + self.max_draft
                                                           + SPAN_MAX), self.max_draft))
            return RoundPlan(PREDICTION, PREDICTION_DRAFTER, tokens=tokens, match=match,
                             context=context)
        if match:
            tokens = tuple(self._text[start:start + self.max_draft])
            return RoundPlan(PREDICTION, PREDICTION_DRAFTER, tokens=tokens, match=match,
                             context=context)
        return self.inner.plan(context, params)

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        if plan.source != PREDICTION:
            if guide is not None and self.inner.guided:
                return self.inner.propose(plan, gamma, params, rng, keep, guide=guide)
            return self.inner.propose(plan, gamma, params, rng, keep)
        # A copy is a function of the committed text and the prediction: `keep` has nothing
        # to add, and the round cuts it where a grammar forbids a token.
        if gamma <= 0 or not plan.tokens:
            return empty_proposal(PREDICTION_DRAFTER)
        return Proposal(tokens=np.asarray(plan.tokens[:gamma], dtype=np.int32), q=None,
                        source=PREDICTION_DRAFTER)

    def prefill(self, context: Sequence[int]) -> None:
        self.inner.prefill(context)

    def feedback(self, plan: RoundPlan, proposal: Proposal, n_accepted: int) -> None:
        if plan.source != PREDICTION:
            self.inner.feedback(plan, proposal, n_accepted)

    def pad_catch_up(self, widths: Callable[[int], int] | None) -> None:
        self.inner.pad_catch_up(widths)

    def reset(self) -> None:
        self._alignment = None
        self.inner.reset()


def with_prediction(drafter: Drafter, prediction: Sequence[int],
                    prompt: Sequence[int]) -> Drafter:
    """`drafter` drafting from `prediction` first, for the generation after `prompt`; itself
    when the prediction is empty."""
    return PredictionDrafter(drafter, prediction, prompt) if len(prediction) else drafter
