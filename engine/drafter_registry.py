"""A pair's drafters by name, and the models only one of them uses.

Offered: "draft" (the draft model) and "hybrid" (prompt lookup, else the draft model) when a
draft is loaded, "lookup" and "suffix" (the longer match in the context or, when a generation
is given one, the history of past requests) always, "early-exit" once the loading step added the
target's first k layers (loading.load.add_early_exit). The default is hybrid when a draft is
loaded (plain decoding otherwise): over the benchmark suite it matched the draft model's medians
with a shorter tail of slow answers, in greedy and sampled runs, and it edits whole files at the
lookup's speed (docs/BENCHMARKS.md). A pairing record's choice is the request's business
(app/runtime/request.py's Offer), not the pair's.
"""
from __future__ import annotations

from typing import Callable

from engine.backend import Backend
from engine.drafters.base import PLAIN, Drafter, plain_alias
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.suffix import SUFFIX, SuffixDrafter
from engine.errors import SettingsError

# Who drafts when nobody says: prompt lookup where the text so far repeats, else the draft model.
DEFAULT_DRAFTER = "hybrid"


class DrafterRegistry:
    """The named drafters of one pair; `forget(name)` hears of each one replaced or removed
    (the pair drops its calibration)."""

    def __init__(self, is_eog: Callable[[int], bool], draft: Backend | None, p_min: float,
                 chain_min: float, lookup_ngram: int,
                 forget: Callable[[str], None] = lambda name: None) -> None:
        self._drafters: dict[str, Drafter] = {}
        # Models only one drafter uses (early exit), by drafter name; closed with the registry.
        self.own_backends: dict[str, Backend] = {}
        self._forget = forget
        if draft is not None:
            model = DraftModelDrafter(draft, p_min=p_min, chain_min=chain_min)
            self._drafters["draft"] = model
            # A 1-gram match is a weaker bet than the draft model, so hybrid wants 2 or more.
            self._drafters["hybrid"] = HybridDrafter(
                PromptLookupDrafter(ngram_max=max(lookup_ngram, 2), ngram_min=2, is_eog=is_eog),
                model)
        self._drafters["lookup"] = PromptLookupDrafter(ngram_max=lookup_ngram, is_eog=is_eog)
        # The longer match in the context or the history of past requests, when a generation is
        # given one.
        self._drafters[SUFFIX] = SuffixDrafter(
            PromptLookupDrafter(ngram_max=max(lookup_ngram, 2), ngram_min=2, is_eog=is_eog),
            is_eog=is_eog)

    @property
    def names(self) -> list[str]:
        return [PLAIN, *self._drafters]

    @property
    def default(self) -> str:
        return DEFAULT_DRAFTER if DEFAULT_DRAFTER in self._drafters else PLAIN

    def add(self, name: str, drafter: Drafter, backend: Backend | None = None) -> None:
        """Offer `drafter` as `name`, replacing any drafter of that name. `backend` is a model
        only this drafter uses: closed with the registry, or when the name is replaced."""
        self._close_own(name)
        if backend is not None:
            self.own_backends[name] = backend
        self._drafters[name] = drafter
        self._forget(name)

    def remove(self, name: str) -> None:
        """Forget drafter `name`, closing the model only it used."""
        self._close_own(name)
        self._drafters.pop(name, None)
        self._forget(name)

    def get(self, name: str) -> Drafter | None:
        """Drafter `name`; None for plain decoding; a clear error for an unknown name."""
        name = plain_alias(name)
        if name == PLAIN:
            return None
        if name not in self._drafters:
            raise SettingsError(f"unknown drafter {name!r}; available: {', '.join(self.names)}")
        return self._drafters[name]

    def speculating(self, name: str) -> Drafter:
        """Drafter `name`, refused for plain decoding (which has no costs to measure)."""
        chosen = self.get(name)
        if chosen is None:
            raise SettingsError("plain decoding drafts nothing to calibrate")
        return chosen

    def reset(self) -> None:
        """Every drafter forgets its state (a model its cache)."""
        for drafter in self._drafters.values():
            drafter.reset()

    def _close_own(self, name: str) -> None:
        old = self.own_backends.pop(name, None)
        if old is not None:
            old.close()

    def close(self) -> None:
        for backend in self.own_backends.values():
            backend.close()
        self.own_backends.clear()
