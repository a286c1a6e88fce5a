"""Prompt lookup: draft by copying what followed an earlier occurrence of the latest n-gram.

No model runs, so a proposal costs microseconds. The last n tokens of the context (prompt plus
text so far) are searched for earlier in the context, longest n first; the tokens that followed
the match are the draft. Tokens carry no probabilities (q is None), so the target verifies them
with the one-hot rule, which keeps the output exact. A copy ends at an end-of-generation token
(`is_eog`, when given): the chat template's turn ends are in the prompt, and nothing after one can
be committed.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.drafters.base import Drafter, Keep, Proposal
from engine.errors import SettingsError
from engine.sampling import Rng, SamplingParams


class PromptLookupDrafter(Drafter):
    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, max_draft: int = 16,
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

    @property
    def copy_name(self) -> str | None:
        return self.name

    def copies(self, context: Sequence[int]) -> bool:
        return True

    def find(self, context: Sequence[int], want: int) -> tuple[int, int, int]:
        """(n, start, length) of the continuation to copy; length 0 when nothing matches."""
        ctx = np.asarray(context, dtype=np.int64)
        size = len(ctx)
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            # Windows over ctx[:-1] start at most at size-1-n, so each match has a successor
            # and the final n-gram does not match itself.
            windows = sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero(np.all(windows == ctx[size - n:], axis=1))
            if hits.size == 0:
                continue
            room = size - (hits + n)
            # The most recent match whose continuation is long enough, else the longest one.
            full = hits[room >= want]
            start = int(full[-1] if full.size else hits[0]) + n
            return n, start, min(want, size - start)
        return 0, 0, 0

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None) -> Proposal:
        # A copy is a function of the committed text alone, so `keep` (a cut for sampled
        # drafts) has nothing to add here.
        n, start, length = self.find(context, min(gamma, self.max_draft)) if gamma > 0 else (0, 0, 0)
        tokens = np.asarray(context[start:start + length], dtype=np.int32)
        if self.is_eog is not None:
            end = next((i for i, t in enumerate(tokens.tolist()) if self.is_eog(t)), None)
            if end is not None:
                tokens = tokens[:end + 1]
        return Proposal(tokens=tokens, q=None, source=self.name, copied=True,
                        meta={"ngram": n, "match": start - n if length else -1})
