"""Prompt lookup: draft by copying what followed an earlier occurrence of the latest n-gram.

No model runs, so a proposal costs microseconds. The last n tokens of the context (prompt plus
text so far) are searched for earlier in the context, longest n first; the tokens that followed
the match are the draft: of the latest occurrence with `max_draft` tokens after it (COPY_MAX, 64,
by default), else of the latest (the round's plan holds the copy, engine/round_plan.py, and a
round takes as much of it as its gamma allows: the adaptive controller prices it at its length). Tokens carry no probabilities (q is None), so the target verifies them
with the one-hot rule, which keeps the output exact. A copy ends at an end-of-generation token
(`is_eog`, when given): the chat template's turn ends are in the prompt, and nothing after one can
be committed. A copy drafts the renames the answer has made to the text it copies
(engine/drafters/substitutions.py): the answer is aligned against the context as it is committed,
and a learnt S -> A is drafted as A where the copy holds S.
"""
from __future__ import annotations

from typing import Callable, Sequence

from bisect import bisect_left, bisect_right

import numpy as np

from engine.drafters.base import Drafter, Keep, Proposal, empty_proposal
from engine.drafters.history_index import MATCH_MAX
from engine.drafters.substitutions import SPAN_MAX, Alignment
from engine.round_plan import CONTEXT, NO_PLAN, RoundPlan
from engine.errors import SettingsError
from engine.generation_config import COPY_MAX
from engine.grammar.guide import Guide
from engine.rng import Rng
from engine.sampling import SamplingParams


class PromptLookupDrafter(Drafter):
    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, max_draft: int = COPY_MAX,
                 is_eog: Callable[[int], bool] | None = None) -> None:
        if not (1 <= ngram_min <= ngram_max):
            raise SettingsError(f"lookup n-gram sizes must satisfy 1 <= min <= max, "
                                f"got min {ngram_min}, max {ngram_max}")
        if max_draft < 1:
            raise SettingsError(f"lookup max draft length must be >= 1, got {max_draft}")
        self.name = "prompt-lookup"
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.max_draft = max_draft
        self.is_eog = is_eog
        self._index: NgramIndex | None = None
        self._alignment: Alignment | None = None

    def find(self, context: Sequence[int], want: int) -> tuple[int, int, int]:
        """(n, start, length) of the continuation to copy; length 0 when nothing matches."""
        size = len(context)
        index = self._index_for(context)
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            # Indexed windows end before the last token, so each match has a successor and the
            # final n-gram does not match itself.
            hits = index.starts(n, context)
            if not hits:
                continue
            # The most recent match whose continuation is long enough, else the most recent.
            j = bisect_right(hits, size - n - want) - 1
            start = (hits[j] if j >= 0 else hits[-1]) + n
            return n, start, min(want, size - start)
        return 0, 0, 0

    def _index_for(self, context: Sequence[int]) -> "NgramIndex":
        """The index of `context`: the one kept from the last call when `context` is the same
        list grown since (a generation appends to one list), else a new one."""
        index = self._index
        if index is None or not index.extends(context):
            index = self._index = NgramIndex(context, range(self.ngram_min, self.ngram_max + 1),
                                             self.is_eog)
            # The answer is what is committed after this first call's context.
            self._alignment = Alignment(context, context, len(context), self._locate)
        index.update()
        return index

    def _locate(self, i: int) -> int:
        """Where in the context a lost answer follows after its token i: after the earlier
        occurrence of the n-gram ending at i that `find` would copy from then, or -1."""
        assert self._index is not None
        n = self.ngram_max
        if i < n:
            return -1
        hits = self._index.occurrences(n, self._index.window(i + 1 - n, i + 1))
        last = bisect_right(hits, i - n)
        if not last:
            return -1
        j = bisect_right(hits, i + 1 - n - self.max_draft, 0, last) - 1
        return (hits[j] if j >= 0 else hits[last - 1]) + n

    def reset(self) -> None:
        self._index = None
        self._alignment = None

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        """A copy of what followed the latest match of the context's end (up to `max_draft`
        tokens, ending at an end-of-generation token), with the match's length: the n-gram
        extended back as far as the context agrees (up to MATCH_MAX); nothing without a match."""
        n, start, length = self.find(context, self.max_draft)
        # The index has found the context's end tokens as it grew (`find` brought it up to date).
        assert self._index is not None and self._alignment is not None
        self._alignment.update()
        if not length:
            return NO_PLAN
        subs = self._alignment.substitutions
        if subs.pairs:
            stop = self._index.first_end(
                start, min(len(context), start + self.max_draft + SPAN_MAX)) + 1
            tokens = subs.rewrite(context, start, stop, self.max_draft)
        else:
            stop = self._index.first_end(start, start + length) + 1
            tokens = list(map(int, context[start:stop]))
        i, j = start - n - 1, len(context) - n - 1
        while n < MATCH_MAX and i >= 0 and context[i] == context[j]:
            n, i, j = n + 1, i - 1, j - 1
        return RoundPlan(CONTEXT, self.name, tokens=tuple(tokens), match=n, context=context)

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        # A copy is a function of the committed text alone, so `keep` (a cut for sampled
        # drafts) has nothing to add here.
        if gamma <= 0 or not plan.tokens:
            return empty_proposal(self.name)
        return Proposal(tokens=np.asarray(plan.tokens[:gamma], dtype=np.int32), q=None,
                        source=self.name)


class NgramIndex:
    """Where each n-gram of a growing context starts, for the n of a lookup: one dictionary per
    n, kept up to date as the context grows, so a round's lookup costs a dictionary read instead
    of a scan of the whole context. Only windows that end before the context's last token are
    indexed (a match needs a successor). With `is_eog`, where the context's end-of-generation
    tokens are (each token asked about once, as it arrives, not once per copy that holds it)."""

    def __init__(self, context: Sequence[int], sizes: range,
                 is_eog: Callable[[int], bool] | None = None) -> None:
        self._context = context
        self._seen = 0
        self._first = [int(t) for t in context[:1]]
        self._starts: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in sizes}
        self._is_eog = is_eog
        self._ends: list[int] = []

    def extends(self, context: Sequence[int]) -> bool:
        """Whether `context` is the list this index was built on, not shrunk since; its first
        token is compared too, so a list reused for another text starts over."""
        return (context is self._context and len(context) >= self._seen
                and [int(t) for t in context[:1]] == self._first)

    def update(self) -> None:
        ctx, size = self._context, len(self._context)
        if size == self._seen:
            return
        for n, table in self._starts.items():
            # Windows i with i + n <= size - 1 are indexed; those up to seen - 1 already were.
            for i in range(max(0, self._seen - n), size - n):
                table.setdefault(tuple(map(int, ctx[i:i + n])), []).append(i)
        if self._is_eog is not None:
            is_eog = self._is_eog
            self._ends.extend(i for i in range(self._seen, size) if is_eog(int(ctx[i])))
        self._seen = size

    def starts(self, n: int, context: Sequence[int]) -> list[int]:
        """Ascending starts of the earlier occurrences of the context's final n-gram."""
        return self._starts[n].get(tuple(map(int, context[len(context) - n:])), [])

    def window(self, start: int, stop: int) -> tuple[int, ...]:
        """The indexed text's tokens [start, stop), as the index keys them."""
        return tuple(map(int, self._context[start:stop]))

    def occurrences(self, n: int, gram: tuple[int, ...]) -> list[int]:
        """Ascending starts of the indexed occurrences of the n-gram `gram`."""
        return self._starts[n].get(gram, [])

    def first_end(self, start: int, stop: int) -> int:
        """The position of the first end-of-generation token in [start, stop), or stop - 1
        when none is (so a copy of [start, stop) ends just after the returned position)."""
        i = bisect_left(self._ends, start)
        return self._ends[i] if i < len(self._ends) and self._ends[i] < stop else stop - 1
