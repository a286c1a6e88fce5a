"""Hybrid drafting: copy when a copying drafter finds a match, else ask the model.

The copying part is prompt lookup (the context), or the suffix drafter (the longer match
in the context or the history of past requests, engine/drafters/suffix.py) when the generation is given a history.
A copy is free and, when it matches (code edits, quoted text, repeated requests), often right
for many tokens; the model covers everything else. The round's plan says which one drafts it
(`RoundPlan.source`); it depends on the committed text (and the history as the generation began)
alone, so the choice keeps the output exact.

The model is not prefilled: it catches up on the text (its session's `sync`) the first time it
drafts, so an answer that copies its prompt never pays the model's decode of the prompt.
"""
from __future__ import annotations

from typing import Callable, Sequence

from engine.drafters.base import Drafter, Keep, Proposal
from engine.drafters.history_index import HistoryIndex
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.grammar.guide import Guide
from engine.drafters.suffix import SuffixDrafter
from engine.round_plan import RoundPlan
from engine.rng import Rng
from engine.sampling import SamplingParams


class HybridDrafter(Drafter):
    uses_history = True

    def __init__(self, lookup: PromptLookupDrafter, model: Drafter,
                 copy: PromptLookupDrafter | SuffixDrafter | None = None) -> None:
        self.name = "hybrid"
        self.lookup = lookup
        self.model = model
        # What copies: prompt lookup, or the suffix drafter over it when given a history.
        self.copy = copy or lookup
        # Calibration times the model's decodes: a copy costs none.
        self.session = model.session
        self.guided = model.guided

    def with_history(self, history: HistoryIndex) -> "HybridDrafter":
        return HybridDrafter(self.lookup, self.model,
                             SuffixDrafter(self.lookup, history, is_eog=self.lookup.is_eog))

    @property
    def model_name(self) -> str | None:
        return self.model.model_name

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        # A round with a copy is planned, priced and drafted as a copy: it copies, or drafts
        # nothing if the copy's own stop declines its first token; never the model, whose
        # decodes and catch-up the decision did not pay for.
        plan = self.copy.plan(context, params)
        return plan if plan.drafts else self.model.plan(context, params)

    def pad_catch_up(self, widths: Callable[[int], int] | None) -> None:
        self.model.pad_catch_up(widths)

    def reset(self) -> None:
        self.copy.reset()
        self.model.reset()

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        part = self.copy if plan.is_copy else self.model
        if guide is not None and part.guided:
            return part.propose(plan, gamma, params, rng, keep, guide=guide)
        return part.propose(plan, gamma, params, rng, keep)

    def feedback(self, plan: RoundPlan, proposal: Proposal, n_accepted: int) -> None:
        part = self.copy if plan.is_copy else self.model
        part.feedback(plan, proposal, n_accepted)
