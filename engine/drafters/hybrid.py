"""Hybrid drafting: copy from the context when prompt lookup finds a match, else ask the model.

The lookup is free and, when it matches (code edits, quoted text), often right for many tokens;
the model covers everything else. `Proposal.source` says which one drafted each round.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.drafters.base import Drafter, Proposal, give_feedback
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.sampling import SamplingParams


class HybridDrafter:
    def __init__(self, lookup: PromptLookupDrafter, model: Drafter) -> None:
        self.name = "hybrid"
        self.lookup = lookup
        self.model = model

    def prefill(self, context: Sequence[int]) -> None:
        hook = getattr(self.model, "prefill", None)
        if hook is not None:
            hook(context)

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        found = self.lookup.propose(context, gamma, params, rng)
        if len(found):
            return found
        proposal = self.model.propose(context, gamma, params, rng)
        proposal.time_ms += found.time_ms
        return proposal

    def feedback(self, proposal: Proposal, n_accepted: int) -> None:
        source = self.lookup if proposal.source == self.lookup.name else self.model
        give_feedback(source, proposal, n_accepted)
