"""Hybrid drafting: copy from the context when prompt lookup finds a match, else ask the model.

The lookup is free and, when it matches (code edits, quoted text), often right for many tokens;
the model covers everything else. `Proposal.copied` says which one drafted each round. Which one
drafts depends on the committed text alone, so the choice keeps the output exact.

The model is not prefilled: it catches up on the text (its session's `sync`) the first time it
drafts, so an answer that copies its prompt never pays the model's decode of the prompt.
"""
from __future__ import annotations

from typing import Callable, Sequence

from engine.drafters.base import Drafter, Keep, Proposal
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.sampling import Rng, SamplingParams


class HybridDrafter(Drafter):
    def __init__(self, lookup: PromptLookupDrafter, model: Drafter) -> None:
        self.name = "hybrid"
        self.lookup = lookup
        self.model = model
        # Calibration times the model's decodes: a copy costs none.
        self.session = model.session

    @property
    def model_name(self) -> str | None:
        return self.model.model_name

    @property
    def copy_name(self) -> str | None:
        return self.lookup.copy_name

    def copies(self, context: Sequence[int]) -> bool:
        return bool(self.lookup.find(context, 1)[2])

    def samples(self, context: Sequence[int], params: SamplingParams) -> bool:
        return not self.copies(context) and self.model.samples(context, params)

    def pad_catch_up(self, widths: Callable[[int], int] | None) -> None:
        self.model.pad_catch_up(widths)

    def behind(self, context: Sequence[int]) -> int:
        return self.model.behind(context)

    def reset(self) -> None:
        self.lookup.reset()
        self.model.reset()

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None) -> Proposal:
        found = self.lookup.propose(context, gamma, params, rng, keep)
        if len(found):
            return found
        return self.model.propose(context, gamma, params, rng, keep)

    def feedback(self, proposal: Proposal, n_accepted: int) -> None:
        part = self.lookup if proposal.copied else self.model
        part.feedback(proposal, n_accepted)
