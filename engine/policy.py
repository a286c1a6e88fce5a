"""How many tokens to draft each round. The generator asks `next_gamma()` before a round and
reports the round back through `update(round)`. `FixedGamma` is the plain policy,
`HeuristicGamma` the transformers-style one, `NeverDraft` the control that keeps every round of
the speculative path plain (what that path costs by itself, and the noise floor any policy is
measured against); the adaptive controller is in `engine.controller`, and `engine.policies` makes
either by name.
"""
from __future__ import annotations

from typing import Sequence

from engine.costs import Calibration
from engine.errors import SettingsError
from engine.stats import ControllerReport, RoundStats

class GammaPolicy:
    """Base class: `next_gamma` and `update` are required; the rest are hooks with defaults."""

    name: str = "policy"
    # Tokens/s the policy expects from the gamma it just chose, when it predicts one, and why
    # it chose it (one line, shown by the CLI, the app and the API).
    last_prediction: float | None = None
    last_reason: str = ""
    # Whether the generator should report the target's top probability per verified row.
    wants_confidence: bool = False

    def next_gamma(self, copying: bool = False, behind: int = 0) -> int:
        """The most tokens the next round may draft; `copying` says whether that round would
        copy from the context rather than run a model (`Drafter.copies`), for policies that
        price the two apart, and `behind` how many committed tokens the drafter must decode
        before it drafts (`Drafter.behind`: its catch-up)."""
        raise NotImplementedError

    @property
    def opening_plain(self) -> int:
        """Rounds the policy always decodes plainly at the start of an answer."""
        return 0

    def calibration_need(self) -> int | None:
        """The largest gamma a calibration must cover before the first round, or None when
        the policy needs none (or already has one); the pair measures it (`Pair.calibration`)
        and hands it to `use_calibration`."""
        return None

    def use_calibration(self, calibration: Calibration) -> None:
        """Take the pair's measured costs (only a policy that asked for them uses them)."""

    def report(self, gamma: int) -> ControllerReport:
        """What the policy knew when it chose `gamma`, its latest choice."""
        return ControllerReport(policy=self.name, gamma=gamma, reason=self.last_reason)

    def update(self, r: RoundStats) -> None:
        raise NotImplementedError

    def keep_drafting(self, own: Sequence[float], sure: float, limit: int,
                      fixed_width: bool) -> bool:
        """Before the draft draws its next token: whether to draw it, from the draft's
        probabilities of the tokens drawn so far this round (`own`), the largest probability
        of the next row (`sure`) and the most tokens this round may draft (`limit`). It must
        not see the token itself (engine/drafters/base.py). `fixed_width`: the round's verify
        batch will be `limit + 1` wide however few tokens are drawn, once one is (a sampled
        draft, engine/generator.py), so stopping after the first saves no verify cost."""
        return True


class FixedGamma(GammaPolicy):
    def __init__(self, gamma: int) -> None:
        self.name = f"fixed-{gamma}"
        self.gamma = gamma
        self.last_reason = f"fixed: gamma {gamma} every round"

    def next_gamma(self, copying: bool = False, behind: int = 0) -> int:
        return self.gamma

    def update(self, r: RoundStats) -> None:
        pass


class NeverDraft(GammaPolicy):
    """Speculative mode with the draft loaded and prefilled, but no round drafts: a benchmark
    control, an A/A run through the speculative path."""

    def __init__(self) -> None:
        self.name = "plain"
        self.last_reason = "plain: the control policy never drafts"

    def next_gamma(self, copying: bool = False, behind: int = 0) -> int:
        return 0

    def update(self, r: RoundStats) -> None:
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

    def next_gamma(self, copying: bool = False, behind: int = 0) -> int:
        self.last_reason = (f"heuristic: gamma {self.gamma} (+2 after a round that kept every "
                            "drafted token, -1 after a rejection)")
        return self.gamma

    def update(self, r: RoundStats) -> None:
        if r.drafted == 0:
            # Nothing was drafted (a lookup without a match): no evidence either way.
            return
        if r.accepted == r.gamma:
            self.gamma = min(self.gamma + 2, self.max_gamma)
        else:
            self.gamma = max(self.gamma - 1, 1)
