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
from engine.drafters.history_index import MATCH_MAX, NO_MATCH, HistoryIndex, HistoryMatch
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.errors import SettingsError
from engine.sampling import Rng, SamplingParams

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
                 is_eog: Callable[[int], bool] | None = None, max_draft: int = 16,
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
        self._last: tuple[tuple[int, ...], HistoryMatch] | None = None

    @property
    def copy_name(self) -> str | None:
        return self.name

    def with_history(self, history: HistoryIndex) -> "SuffixDrafter":
        return SuffixDrafter(self.lookup, history, self.is_eog, self.max_draft, self.min_share,
                             self.spec_factor)

    def _context_match(self, context: Sequence[int]) -> int:
        """How many tokens the context's own match covers (prompt lookup's n-gram, extended
        back as far as it agrees, up to MATCH_MAX); 0 when it has none."""
        n, start, length = self.lookup.find(context, 1)
        if not length:
            return 0
        i, j = start - n - 1, len(context) - n - 1
        while n < MATCH_MAX and i >= 0 and context[i] == context[j]:
            n, i, j = n + 1, i - 1, j - 1
        return n

    def _history_match(self, context: Sequence[int]) -> HistoryMatch:
        """The history's continuation of `context` (at most `max_draft` tokens), kept for the
        round's `propose` after `copy_source` asked: it depends only on the context's last
        MATCH_MAX tokens and on the history, which does not change during a generation."""
        if self.history is None:
            return NO_MATCH
        key = tuple(int(t) for t in context[-MATCH_MAX:])
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        match = self.history.match(context, self.max_draft, self.min_share, HISTORY_MATCH_MIN)
        self._last = (key, match)
        return match

    def match_source(self, context: Sequence[int]) -> str | None:
        """The source with the longer match of `context`'s end: the history when its match
        is longer, else the context (which also wins a tie); None when neither has one."""
        in_context = self._context_match(context)
        history = self._history_match(context)
        if len(history) and history.length > in_context:
            return self.name
        return self.lookup.name if in_context else None

    def copy_source(self, context: Sequence[int]) -> str | None:
        # Alone, every round copies (or drafts nothing); which source it copies from has
        # acceptance counts of its own.
        return self.match_source(context) or self.lookup.name

    def reset(self) -> None:
        self.lookup.reset()
        self._last = None

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None) -> Proposal:
        if gamma <= 0 or self.match_source(context) != self.name:
            return self.lookup.propose(context, gamma, params, rng, keep)
        match = self._history_match(context)
        limit = min(len(match), gamma, max(1, int(self.spec_factor * match.length)))
        tokens: list[int] = []
        for i in range(limit):
            # The shares are the history's, fixed before the round: a stop on them reads
            # nothing the target decides.
            if keep is not None and not keep(match.shares[:i], match.shares[i]):
                break
            tokens.append(match.tokens[i])
            if self.is_eog is not None and self.is_eog(match.tokens[i]):
                break
        if not tokens:
            return empty_proposal(self.name)
        return Proposal(tokens=np.asarray(tokens, dtype=np.int32), q=None, source=self.name,
                        copied=True, meta={"match": match.length,
                                           "occurrences": match.occurrences,
                                           "document": match.document})

    def feedback(self, proposal: Proposal, n_accepted: int) -> None:
        if proposal.source == self.name and n_accepted > 0 and self.history is not None:
            self.history.touch(int(proposal.meta["document"]))
