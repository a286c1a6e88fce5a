"""Suffix drafting: copy the continuation of the longest match of the text's end, from the
current context (prompt lookup) or from the history of past prompts and answers
(engine/drafters/history_index.py), as suffix decoding does; the context wins a tie.

No model runs, so a round costs only its verify. The history's continuation comes with each
token's share among the earlier occurrences that reached it (the suffix tree's child frequency):
the policy's `keep` reads those shares as the draft's own probabilities, so the length of a
copy follows how often the history went that way, and a run of the history that was not
repeated is not drafted far. Tokens carry no q rows, so the target verifies them with the
one-hot rule. What is drafted is a function of the committed text and of the history as the
generation began (the generator adds to it only when the generation ends), which keeps the
output exact (docs/EXACTNESS.md).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from engine.drafters.base import Drafter, Keep, Proposal, empty_proposal
from engine.drafters.history_index import HistoryIndex
from engine.round_plan import HISTORY, RoundPlan
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.errors import SettingsError
from engine.generation_config import COPY_MAX
from engine.grammar.guide import Guide
from engine.rng import Rng
from engine.sampling import SamplingParams

SUFFIX = "suffix"
# A copy from the history stops before the token at which fewer than this share of the matching
# occurrences still agree (Arctic Inference's min_token_prob).
MIN_SHARE = 0.1
# A copy from the history drafts at most this many tokens per token matched (its
# max_spec_factor): a short match is a weak bet.
SPEC_FACTOR = 2.0
# The shortest match the history drafts from. In a history of millions of tokens nearly every
# 2-gram has occurred, so a 2-token match says little, and it would turn almost every round
# into a copy (hybrid's model would never draft); the context, a few thousand tokens, keeps
# prompt lookup's 2. Four is the index's finer key (engine/drafters/history_index.py).
HISTORY_MATCH_MIN = 4


class SuffixDrafter(Drafter):
    """`lookup` copies from the context; `history`, when given, when its match is longer.
    Without a history it is prompt lookup under another name."""

    uses_history = True

    def __init__(self, lookup: PromptLookupDrafter, history: HistoryIndex | None = None,
                 is_eog: Callable[[int], bool] | None = None, max_draft: int = COPY_MAX,
                 min_share: float = MIN_SHARE, spec_factor: float = SPEC_FACTOR) -> None:
        if not (0.0 <= min_share < 1.0):
            raise SettingsError(f"suffix min share must be in [0, 1), got {min_share}")
        if spec_factor <= 0:
            raise SettingsError(f"suffix spec factor must be > 0, got {spec_factor}")
        self.name = SUFFIX
        self.lookup = lookup
        self.history = history
        self.is_eog = is_eog
        self.max_draft = max_draft
        self.min_share = min_share
        self.spec_factor = spec_factor

    def with_history(self, history: HistoryIndex) -> "SuffixDrafter":
        return SuffixDrafter(self.lookup, history, self.is_eog, self.max_draft, self.min_share,
                             self.spec_factor)

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        """The copy with the longer match of `context`'s end: the history's when its match is
        longer (and at least HISTORY_MATCH_MIN tokens), else the context's, which also wins a
        tie; nothing when neither has one. A copy from the history drafts at most
        `spec_factor` tokens per token matched."""
        in_context = self.lookup.plan(context, params)
        if self.history is None:
            return in_context
        match = self.history.match(context, self.max_draft, self.min_share, HISTORY_MATCH_MIN)
        if not len(match) or match.length <= in_context.match:
            return in_context
        limit = min(len(match), max(1, int(self.spec_factor * match.length)))
        tokens = match.tokens[:limit]
        if self.is_eog is not None:
            end = next((i for i, t in enumerate(tokens) if self.is_eog(t)), None)
            if end is not None:
                tokens = tokens[:end + 1]
        return RoundPlan(HISTORY, self.name, tokens=tuple(int(t) for t in tokens),
                         shares=tuple(float(v) for v in match.shares[:len(tokens)]),
                         match=match.length, document=match.document, context=context)

    def reset(self) -> None:
        self.lookup.reset()

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        if plan.source != HISTORY:
            return self.lookup.propose(plan, gamma, params, rng, keep)
        tokens: list[int] = []
        for i in range(min(len(plan.tokens), gamma)):
            # The shares are the history's, fixed before the round: a stop on them reads
            # nothing the target decides.
            if keep is not None and not keep(plan.shares[:i], plan.shares[i]):
                break
            tokens.append(plan.tokens[i])
        if not tokens:
            return empty_proposal(self.name)
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32), q=None, source=self.name)

    def feedback(self, plan: RoundPlan, proposal: Proposal, n_accepted: int) -> None:
        if plan.source == HISTORY and n_accepted > 0 and self.history is not None:
            self.history.touch(plan.document)
