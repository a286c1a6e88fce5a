"""How many tokens to draft each round. Before a round the generator asks the policy's
`next_gamma(plan)` (the drafter's plan of the round, engine/round_plan.py), which hands out a
`Decision`; after it, the policy takes that decision back with
the round's outcome in `update(decision, round)`. Everything a choice depended on travels in the
decision, so nothing the policy holds changes between the two calls.

`FixedGamma` is the plain policy, `HeuristicGamma` the transformers-style one, `NeverDraft` the
control that keeps every round of the speculative path plain (what that path costs by itself, and
the noise floor any policy is measured against); the adaptive controller is in
`engine.control.controller`, and `engine.control.registry` makes either by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.control.batch import ALONE, Batch
from engine.control.costs import Calibration
from engine.control.evidence import Evidence
from engine.round_plan import NO_PLAN, RoundPlan
from engine.errors import SettingsError
from engine.stats import ControllerReport, RoundStats


@dataclass(frozen=True)
class Decision:
    """A policy's choice for one round, and what it was made from.

    >>> FixedGamma(3).next_gamma()
    Decision(gamma=3, plan=RoundPlan(source='', drafter='', tokens=(), shares=(), match=0, document=-1, behind=0, samples=False), prediction=None, reason='fixed: gamma 3 every round', probing=False, speeds=(), confidence=True, batch=Batch(sequences=1, other_width=0, other_tokens=None, other_drafts=()))
    """

    # The most tokens the round may draft (0: a plain round).
    gamma: int
    # The drafter's plan of the round, which the choice was made from.
    plan: RoundPlan = NO_PLAN
    # The tokens/s the policy expects of the round (None: it predicts nothing), and why it
    # chose this gamma, in one line (shown by the CLI, the app and the API).
    prediction: float | None = None
    reason: str = ""
    # The adaptive controller's: whether the round is a probe of a draft that plain decoding
    # was beating, and the predicted tokens/s of every gamma 0..max it compared.
    probing: bool = False
    speeds: tuple[float, ...] = ()
    # Whether the round should report the target's confidence, for a policy that wants it
    # (`GammaPolicy.wants_confidence`): one that reads it only now and then says when.
    confidence: bool = True
    # The batch the round runs in (engine/control/batch.py), as the caller gave it.
    batch: Batch = ALONE


class GammaPolicy:
    """Base class: `next_gamma` and `update` are required; the rest declare what the policy
    needs (its confidence rows, a calibration) and hooks with defaults."""

    name: str = "policy"
    # Whether the generator should report the target's top probability per verified row.
    wants_confidence: bool = False

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        """The decision for the next round, from the drafter's `plan` of it (where its draft
        would come from, a copy's match, a model's catch-up), for policies that price them, and
        the `batch` it runs in (what the other sequences of its step put into it; a policy that
        does not price rounds ignores it)."""
        raise NotImplementedError

    def update(self, decision: Decision, r: RoundStats) -> None:
        """Take back the round's decision with what the round did."""
        raise NotImplementedError

    def finish(self) -> None:
        """The generation ended (a policy that keeps evidence across answers hands it on)."""

    def report(self, decision: Decision) -> ControllerReport:
        """What the policy knew when it made `decision`, its latest."""
        return ControllerReport(policy=self.name, gamma=decision.gamma, reason=decision.reason)

    @property
    def opening_plain(self) -> int:
        """Rounds the policy always decodes plainly at the start of an answer."""
        return 0

    def calibration_need(self) -> int | None:
        """The largest gamma a calibration must cover before the first round, or None when
        the policy needs none (or already has one); the pair measures it (`Pair.calibration`)
        and hands it to `use_calibration` with the drafter's evidence."""
        return None

    def use_calibration(self, calibration: Calibration, evidence: Evidence) -> None:
        """Take the drafter's measured costs and its evidence, what earlier answers learned
        (engine/knowledge.py; only a policy that asked for them uses them)."""

    def keep_drafting(self, own: Sequence[float], sure: float, limit: int,
                      fixed_width: bool) -> bool:
        """Before the draft draws its next token: whether to draw it, from the draft's
        probabilities of the tokens drawn so far this round (`own`), the largest probability
        of the next row (`sure`) and the most tokens this round may draft (`limit`). It must
        not see the token itself (engine/drafters/base.py). `fixed_width`: the round's verify
        batch will be `limit + 1` wide however few tokens are drawn, once one is (a sampled
        draft, engine/round.py), so stopping after the first saves no verify cost."""
        return True


class FixedGamma(GammaPolicy):
    def __init__(self, gamma: int) -> None:
        self.name = f"fixed-{gamma}"
        self.gamma = gamma

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        return Decision(self.gamma, plan, reason=f"fixed: gamma {self.gamma} every round",
                        batch=batch)

    def update(self, decision: Decision, r: RoundStats) -> None:
        pass


class NeverDraft(GammaPolicy):
    """Speculative mode with the draft loaded and prefilled, but no round drafts: a benchmark
    control, an A/A run through the speculative path."""

    def __init__(self) -> None:
        self.name = "plain"

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        return Decision(0, plan, reason="plain: the control policy never drafts", batch=batch)

    def update(self, decision: Decision, r: RoundStats) -> None:
        pass


class HeuristicGamma(GammaPolicy):
    """+2 after a round that accepted everything drafted, -1 after any rejection, never below 1
    (Hugging Face transformers' "heuristic" schedule for assistant tokens)."""

    def __init__(self, gamma: int, max_gamma: int = 32) -> None:
        if gamma < 1:
            raise SettingsError(f"the heuristic policy needs a starting gamma >= 1, got {gamma}")
        self.name = "heuristic"
        self.gamma = min(gamma, max_gamma)
        self.max_gamma = max_gamma

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        return Decision(self.gamma, plan,
                        reason=(f"heuristic: gamma {self.gamma} (+2 after a round that kept "
                                "every drafted token, -1 after a rejection)"), batch=batch)

    def update(self, decision: Decision, r: RoundStats) -> None:
        if r.drafted == 0:
            # Nothing was drafted (a lookup without a match): no evidence either way.
            return
        if r.accepted == r.gamma:
            self.gamma = min(self.gamma + 2, self.max_gamma)
        else:
            self.gamma = max(self.gamma - 1, 1)
