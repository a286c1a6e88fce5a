"""The drafter base class shared by every way of proposing tokens.

A drafter answers one question per round, `plan(context, params)` (engine/round_plan.py:
where the draft would come from, what a copy would propose, how far a model is behind, whether
the draft samples); the policy decides from that plan, and `propose(plan, gamma, params, rng,
keep)` drafts from the same plan: up to `gamma` token ids and, when the drafter sampled them from
a distribution q, its rows (n `Dist`s); `q is None` means the tokens carry no probabilities and
are verified with the one-hot rule (q one-hot at each token, which is also what a model drafting
greedily has, so it gives no rows). A new drafter implements `plan` and `propose`.

What may decide whether drafted token x_i is put before the target (docs/EXACTNESS.md): the
committed text, x_0..x_{i-1}, and the draft's row q_i *before* x_i is drawn. Never x_i itself,
nor anything drawn after it: a token kept or dropped on its own value no longer comes from q_i,
and the p/q rule given q_i is then not exact. So every early stop is a stopping rule checked
before the next draw, and `keep` (the policy's, engine/control/policy.py) is called with exactly that
information: the draft's probabilities of the tokens already drawn and a statistic of the next
row (its largest probability), before the token is drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import numpy.typing as npt

from engine.dist import Dist
from engine.drafters.history_index import HistoryIndex
from engine.round_plan import MODEL, RoundPlan
from engine.grammar.guide import Guide
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session

I32 = npt.NDArray[np.int32]

# The drafter of plain decoding, by the one word users see for no speculation: in the drafter
# choices, the statistics' mode and a token's origin. "none", the name it once had, is read as it.
PLAIN = "plain"
_OLD_PLAIN = "none"


def plain_alias(name: str) -> str:
    """A drafter's name as given, with the old name of plain decoding read as `PLAIN`."""
    return PLAIN if name == _OLD_PLAIN else name

# keep(own, sure): whether to draw the next draft token, given `own`, the draft's probability
# of each token drawn so far this round, and `sure`, the largest probability in the next row.
Keep = Callable[[Sequence[float], float], bool]


@dataclass
class Proposal:
    tokens: I32
    # q_i per drafted token (`Dist`, engine/dist.py); None: the one-hot rule.
    q: Sequence[Dist] | None = None
    # Which drafter produced the tokens, by name, for reports (the hybrid drafter delegates).
    source: str = ""

    def __len__(self) -> int:
        return len(self.tokens)


def empty_proposal(source: str) -> Proposal:
    return Proposal(tokens=np.zeros(0, dtype=np.int32), q=None, source=source)


class Drafter:
    """Base class. Subclasses implement `plan` and `propose`; the rest declare what the pair and
    the generator need to know of a drafter (its model) and hooks that default to doing
    nothing."""

    name: str = "drafter"
    # The model session a drafter decodes with, if any: calibration times its decodes.
    session: Session | None = None

    def plan(self, context: Sequence[int], params: SamplingParams) -> RoundPlan:
        """What the round after `context` would draft (engine/round_plan.py): a function of
        the committed text (and of the history as the generation began) alone. By default a
        model's round that is never behind and draws nothing (its draft is a function of the
        text): a drafter with a cache, a copy or a sampled draft says so in its own."""
        return RoundPlan(MODEL, self.name, context=context)

    def propose(self, plan: RoundPlan, gamma: int, params: SamplingParams, rng: Rng,
                keep: Keep | None = None, guide: Guide | None = None) -> Proposal:
        """At most `gamma` tokens, drafted as `plan` (this drafter's, for this round) says."""
        raise NotImplementedError

    def draft(self, context: Sequence[int], gamma: int, params: SamplingParams, rng: Rng,
              keep: Keep | None = None) -> Proposal:
        """Plan and propose in one call, for a caller outside a round (tools, tests)."""
        return self.propose(self.plan(context, params), gamma, params, rng, keep)

    @property
    def model_name(self) -> str | None:
        """The name of the part that runs a model (reports price it), None when none does."""
        return self.name if self.session is not None else None

    # Whether `propose` takes a `guide` (engine/grammar/guide.py) and masks its q rows with it: a
    # model drafting under a grammar. A copy needs none: the round cuts it before the first token
    # the grammar forbids.
    guided: bool = False

    # Whether `with_history` gives this drafter something to draft from: a drafter that copies
    # from the history of past prompts and answers (engine/drafters/suffix.py).
    uses_history: bool = False

    def with_history(self, history: HistoryIndex) -> "Drafter":
        """This drafter drafting from `history` too, for one generation (itself when it
        does not use a history). The history must not change until the generation ends."""
        return self

    def prefill(self, context: Sequence[int]) -> None:
        """Called once with the prompt before the first round (a model warms its cache)."""

    def feedback(self, plan: RoundPlan, proposal: Proposal, n_accepted: int) -> None:
        """Hears how many of the tokens proposed from `plan` the target accepted."""

    def pad_catch_up(self, widths: Callable[[int], int] | None) -> None:
        """Decode catch-up batches at `widths(n)` tokens (padding, engine/widths.py); the pair
        sets it from the drafter's calibration. Only a drafter with a model cache has any."""

    def reset(self) -> None:
        """Forget all state (a benchmark's cold start)."""

