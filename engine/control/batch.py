"""The batch a round runs in: what the other sequences decoded in the same step put into it.

With several sequences decoded together (`--parallel`), a round does not have the target to
itself: its rows go into one target decode with every other sequence's rows, and its draft
decodes into one draft batch per depth with theirs. The caller says what the others contribute
(`Batch`), and the adaptive controller prices the round at the step's total width
(`CostModel.step_ms`, engine/control/costs.py). `ALONE`, the default, is a sequence with
the models to itself, priced exactly as before batches existed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from engine.errors import SettingsError


@dataclass(frozen=True)
class Batch:
    # Sequences in the step, this one included.
    sequences: int = 1
    # Rows the other sequences put into the step's target decode (each at least one).
    other_width: int = 0
    # Tokens the other sequences are expected to commit in the step (None: one each, what a
    # plain round commits, the least any round commits).
    other_tokens: float | None = None
    # The depths of the other sequences' drafts that run through the draft model in the step
    # (their gammas): the draft decodes one batch per depth, which this sequence's draft joins.
    other_drafts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        others = self.sequences - 1
        if others < 0:
            raise SettingsError(f"a batch holds at least one sequence, got {self.sequences}")
        if self.other_width < others:
            raise SettingsError(f"{others} other sequences put at least {others} rows into a "
                                f"step, got {self.other_width}")
        if len(self.other_drafts) > others or min(self.other_drafts, default=1) < 1:
            raise SettingsError(f"at most {others} other drafts, each at least one token deep, "
                                f"got {self.other_drafts}")
        if self.other_tokens is not None and self.other_tokens < others:
            raise SettingsError(f"{others} other sequences commit at least {others} tokens a "
                                f"step, got {self.other_tokens}")

    @property
    def alone(self) -> bool:
        return self.sequences == 1

    @property
    def others_commit(self) -> float:
        """Tokens the other sequences are expected to commit in the step."""
        others = self.sequences - 1
        return float(others) if self.other_tokens is None else float(self.other_tokens)

    def drafting_at(self, depth: int) -> int:
        """Other sequences whose drafts reach `depth` (1: the first drafted token)."""
        return sum(d >= depth for d in self.other_drafts)

    @property
    def width(self) -> int:
        """The step's target width with this sequence's round plain (one row)."""
        return self.other_width + 1


ALONE = Batch()


@dataclass(frozen=True)
class Share:
    """What one other sequence puts into a step: its target rows, the tokens its round is
    expected to commit (its last round's, or its decision's expectation), and how deep its draft
    runs through the draft model (0: none, a copy or a plain round)."""
    rows: int
    tokens: float
    draft_depth: int = 0


def among(others: Sequence[Share]) -> Batch:
    """The batch a sequence runs in beside `others` (`ALONE` beside none).

    >>> among([Share(5, 3.2, 4), Share(1, 1.0)])
    Batch(sequences=3, other_width=6, other_tokens=4.2, other_drafts=(4,))
    """
    if not others:
        return ALONE
    return Batch(len(others) + 1, sum(o.rows for o in others), sum(o.tokens for o in others),
                 tuple(o.draft_depth for o in others if o.draft_depth > 0))


class Mates(Protocol):
    """The other sequences of a generation's steps, as its rounds see them: `batch` is what they
    put into the next step (`ALONE` when none runs beside it), and `report` tells them what this
    sequence's last round put in (engine/batch_step.py keeps both); `draft_parts` promises, before
    a sampled draft draws, how many decodes of its model the round's draft takes, so where its
    verify lands in the steps does not follow the draws."""

    def batch(self) -> Batch: ...

    def report(self, share: Share) -> None: ...

    def draft_parts(self, n: int) -> None: ...
