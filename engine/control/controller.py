"""The adaptive controller: each round, the gamma (0 = plain decoding) that maximises expected
committed tokens per second. Three parts: the cost model prices a round (engine/control/costs.py), the
acceptance estimator predicts how many of its drafted tokens survive (engine/control/estimator.py), and
this chooser compares the predicted speed of every gamma, decides, and says why in one line.
Its constants are gathered in engine/control/constants.py; docs/design/controller.md is the
reference for the design and the measurements behind it.

Gamma is the most a round may draft: `keep_drafting` stops the draft earlier when the next
token is not worth its verify width and draft decode. Like every early stop it reads only what
comes before the token it decides on, which keeps the output exact (docs/EXACTNESS.md).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from engine.control.constants import DEFAULTS, ControllerConstants
from engine.control.costs import Calibration, CostModel, calibrate
from engine.errors import SettingsError
from engine.control.estimator import AcceptanceEstimator
from engine.control.policy import Decision, GammaPolicy
from engine.stats import ControllerReport, RoundStats

__all__ = ["AdaptiveController", "Calibration", "calibrate"]


class AdaptiveController(GammaPolicy):
    """Without costs at construction it is uncalibrated, and asks for a calibration
    (`calibration_need`) that `Pair.generate` supplies before the first round. Keyword
    `overrides` replace fields of `constants`.

    Its state is what the rounds so far taught it (costs, acceptance counts, how long plain
    decoding has run): `update` writes it, `next_gamma` only reads it, so any question
    (`predict`, `predicted_tps`, ...) gets the same answer whatever was asked before."""

    wants_confidence = True

    def __init__(self, max_gamma: int = 8, draft_ms: Sequence[float] | None = None,
                 verify_ms: Sequence[float] | None = None, model_name: str | None = None,
                 copy_name: str | None = None,
                 constants: ControllerConstants = DEFAULTS, **overrides) -> None:
        if max_gamma < 1:
            raise SettingsError(f"the adaptive controller needs max gamma >= 1, got {max_gamma}")
        try:
            c = replace(constants, **overrides)
        except TypeError as exc:
            raise SettingsError(f"unknown controller setting: {exc}") from None
        if c.opening_plain < 0:
            raise SettingsError(f"plain opening tokens must be >= 0, got {c.opening_plain}")
        self.name = "adaptive"
        self.constants = c
        self.max_gamma = max_gamma
        # The drafter's parts by name, for the report (Calibration.model_name, copy_name).
        self.model_name = model_name
        self.copy_name = copy_name
        self.costs: CostModel | None = None
        self.estimator = AcceptanceEstimator(max_gamma, c)
        # Which part the last round gave gamma to ((copying, source), None when it was plain), how
        # many plain rounds have run since one drafted, and the plain rounds to wait before the
        # next probe.
        self.speculating: tuple[bool, str] | None = None
        self.zero_run = 0
        self.interval = c.probe_every
        # Rounds and committed tokens so far in this answer.
        self.rounds = 0
        self.elapsed = 0
        if verify_ms is not None:
            self.use_calibration(Calibration(
                list(draft_ms if draft_ms is not None else [0.0] * len(verify_ms)),
                list(verify_ms), model_name, copy_name))

    @property
    def calibrated(self) -> bool:
        return self.costs is not None

    def calibration_need(self) -> int | None:
        return None if self.calibrated else self.max_gamma

    @property
    def opening_plain(self) -> int:
        return self.constants.opening_plain

    def use_calibration(self, calibration: Calibration) -> None:
        self.costs = CostModel(calibration, self.constants.rate)
        self.model_name = calibration.model_name
        self.copy_name = calibration.copy_name

    def _costs(self) -> CostModel:
        if self.costs is None:
            raise SettingsError("the adaptive controller has no calibration; "
                                "run it through Pair.generate or pass draft_ms/verify_ms")
        return self.costs

    # Prediction ---------------------------------------------------------------------------
    # `copying` and `behind` describe the round being priced (Decision's fields): whether it
    # copies from the context, and how many committed tokens the draft model must catch up on.

    def _rounds_ahead(self, expected: np.ndarray) -> np.ndarray:
        """Rounds over which a resumption's catch-up is spread, for rounds expected to commit
        `expected` tokens: at least `horizon`, and as many as the answer so far would fill (up
        to `horizon_cap` tokens). The length so far is the only guess of what remains (Gott's
        rule); early in an answer it may be about to end, so resuming must pay quickly."""
        c = self.constants
        if c.horizon_cap <= 0:
            return np.full(len(expected), c.horizon)
        return np.maximum(c.horizon, min(self.elapsed, c.horizon_cap) / expected)

    def predict(self, copying: bool = False, behind: int = 0,
                hope: float = 0.0, source: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(expected tokens, expected ms) of a round drafting each gamma 0..max_gamma
        (`hope`: imagined successes per position; `source`: the copying part)."""
        costs = self._costs()
        expected = self.estimator.expected(copying, self._opening_cap(), hope, source)
        # costs.round_ms for every gamma at once: the verify, plus for the draft model its
        # decodes and the share of its catch-up charged to this round.
        ms = costs.verify_costs(self.max_gamma + 1).copy()
        if not copying:
            gammas = np.arange(1, self.max_gamma + 1)
            catch_up = costs.catch_up_ms(max(behind, 1))
            ms[1:] += gammas * costs.draft_token + catch_up / self._rounds_ahead(expected[1:])
        return expected, ms

    def _opening_cap(self) -> float:
        """The most acceptance this round may be judged at: the opening's, early on."""
        opening = self.constants.opening
        return opening[self.rounds] if self.rounds < len(opening) else 1.0

    def acceptance(self, copying: bool = False, source: str = "") -> np.ndarray:
        """Estimated a_j per draft position, for a round that copies (with `source`) or one
        that does not."""
        return self.estimator.acceptance(copying, source=source)

    def predicted_tps(self, gamma: int, copying: bool = False, behind: int = 0,
                      source: str = "") -> float:
        expected, ms = self.predict(copying, behind, source=source)
        return 1e3 * float(expected[gamma] / ms[gamma])

    def cost_ms(self, gamma: int, copying: bool = False, behind: int = 0) -> float:
        return float(self.predict(copying, behind)[1][gamma])

    # Choice -------------------------------------------------------------------------------

    def _pays(self, g: int, expected: np.ndarray, ms: np.ndarray, margin: float) -> bool:
        """Whether drafting `g` is predicted to save more than `margin` of what its round loses
        when nothing is accepted (its cost over a plain token's): a choice's hysteresis in
        units of its own risk, the same on any verify curve."""
        saved = expected[g] * ms[0] - ms[g]
        return saved > 0 and saved > margin * (ms[g] - ms[0])

    def best_gamma(self, copying: bool = False, behind: int = 0, source: str = "") -> int:
        return self._choose(copying, behind, *self.predict(copying, behind, source=source),
                            source=source)

    def _choose(self, copying: bool, behind: int, expected: np.ndarray, ms: np.ndarray,
                source: str = "") -> int:
        """How far to draft is chosen hopefully (positions a round has not tested may be better
        than their estimate), whether to draft on the estimate itself; the best gamma by the
        estimate is the fallback."""
        c = self.constants
        hopeful, hopeful_ms = self.predict(copying, behind, c.hope, source)
        # Starting again after plain rounds bets on an estimate partly made of the target's
        # confidence, so it needs a larger predicted saving than carrying on does; so does the
        # model after a copy (its estimate and its catch-up were not just tested).
        carrying_on = self.speculating is not None and (copying or
                                                        self.speculating == (False, ""))
        margin = c.margin if carrying_on else c.resume_margin
        for e, m in ((hopeful, hopeful_ms), (expected, ms)):
            g = int(np.argmax(e[1:] / m[1:])) + 1
            if self._pays(g, expected, ms, margin):
                return g
        return 0

    def could_win(self, copying: bool = False, behind: int = 0,
                  ms: np.ndarray | None = None) -> bool:
        """Whether any gamma would beat plain decoding if every drafted token were accepted;
        when not, probing can only lose. `ms`: the round costs `predict` gave already."""
        if ms is None:
            _, ms = self.predict(copying, behind)
        full = np.arange(self.max_gamma + 1) + 1.0
        # _pays for every gamma at once.
        saved = full[1:] * ms[0] - ms[1:]
        return bool(np.any((saved > 0) & (saved > self.constants.margin * (ms[1:] - ms[0]))))

    def next_gamma(self, copying: bool = False, behind: int = 0, source: str = "") -> Decision:
        c = self.constants
        expected, ms = self.predict(copying, behind, source=source)
        speeds = 1e3 * expected / ms
        probing = False
        if self.rounds < c.opening_plain:
            g = 0
        else:
            g = self._choose(copying, behind, expected, ms, source)
            # Probe (after the opening) while nothing is known of this source; later probes
            # pay the draft's catch-up, hence long, growing intervals (the target's confidence
            # usually brings speculation back first).
            opening = self.rounds < len(c.opening)
            if g == 0 and not opening and (self.estimator.counts(copying, source).empty
                                           or self.zero_run >= self.interval) \
                    and self.could_win(copying, behind, ms):
                g = min(c.probe_gamma, self.max_gamma)
                probing = True
        return Decision(g, copying, behind, source, prediction=float(speeds[g]),
                        reason=self._reason(g, copying, probing, speeds, source),
                        probing=probing,
                        speeds=tuple(float(v) for v in speeds))

    def _reason(self, g: int, copying: bool, probing: bool, speeds: np.ndarray,
                source: str = "") -> str:
        """One line on the choice of `g`, from the predictions that made it."""
        c = self.constants
        best = int(np.argmax(speeds[1:])) + 1
        gain = speeds / speeds[0]
        a0 = float(self.acceptance(copying, source)[0])
        if self.rounds < c.opening_plain:
            return (f"plain: opening round {self.rounds + 1} of {c.opening_plain} (the "
                    "target shows how predictable the answer is before the draft is tried)")
        if g == 0 and self._opening_cap() < 1.0:
            return (f"plain: the answer's opening, where drafts are accepted at most "
                    f"{self._opening_cap():.2f}; best predicted {gain[best]:.2f}x at gamma {best}")
        if copying:
            what = ("copying from past requests" if source == "suffix"
                    else "copying from the context") + ", which costs no draft decode"
            if g == 0:
                return f"plain: best predicted {gain[best]:.2f}x at gamma {best}, {what}"
            return (f"gamma {g}: predicted {gain[g]:.2f}x (first-token acceptance {a0:.2f}, "
                    f"{what})")
        if probing:
            return f"probe: gamma {g} to measure the draft again (predicted {gain[g]:.2f}x)"
        cost = self._costs().draft_relative()
        if g == 0:
            return (f"plain: the draft costs {cost:.2f} of a target token; best predicted "
                    f"{gain[best]:.2f}x at gamma {best}")
        return (f"gamma {g}: predicted {gain[g]:.2f}x (first-token acceptance {a0:.2f}, the "
                f"draft {cost:.2f} of a target token)")

    def report(self, decision: Decision) -> ControllerReport:
        costs = self._costs()
        draft = {}
        if self.model_name:
            draft[self.model_name] = round(costs.draft_relative(), 4)
        if self.copy_name:
            draft[self.copy_name] = 0.0
        speeds = (np.array(decision.speeds) if decision.speeds
                  else 1e3 / np.ones(self.max_gamma + 1))
        return ControllerReport(
            policy=self.name, gamma=decision.gamma, reason=decision.reason,
            source=(decision.source or self.copy_name or "") if decision.copying
            else (self.model_name or ""),
            verify_ms=[round(v, 3) for v in costs.pad_verify],
            draft_cost=draft,
            predicted_speedup=[round(float(s / speeds[0]), 3) for s in speeds])

    def keep_drafting(self, own: Sequence[float], sure: float, limit: int,
                      fixed_width: bool) -> bool:
        """Before the draft draws token k = len(own): draw it when some round of m tokens,
        k < m <= limit, is worth more than stopping at k. A token counts as accepted with the
        draft's own probability (of the tokens drawn, then `sure` for each further one); a
        round's worth is its expected accepted tokens less its extra verify width and draft
        decodes, in target tokens (the draft's row for token k is paid for already)."""
        costs = self._costs()
        one = costs.verify[0]
        k = len(own)

        def width(m: int) -> int:
            return limit + 1 if fixed_width and m > 0 else m + 1

        chain = float(np.prod(own)) if k else 1.0
        stop_cost = costs.verify_cost(width(k))
        gain = 0.0
        for m in range(k + 1, max(limit, k + 1) + 1):
            chain *= sure
            gain += chain
            extra = costs.verify_cost(width(m)) - stop_cost + (m - k - 1) * costs.draft_token
            if gain > extra / one:
                return True
        return False

    # Learning -----------------------------------------------------------------------------

    def update(self, decision: Decision, r: RoundStats) -> None:
        costs = self._costs()
        c = self.constants
        copied = decision.copying
        self.rounds += 1
        self.elapsed += r.committed
        if r.drafted > 0:
            if not copied:
                costs.learn_draft(r.draft_ms, r.drafted, max(decision.behind, 1))
            self.estimator.learn(r.drafted, r.accepted, copied, r.confidence, decision.source)
        if r.confidence and (r.drafted == 0 or (not copied and r.accepted == r.drafted)):
            # The bonus row after a fully accepted draft, like a plain round's row, is a
            # position no draft was tested on: its confidence says how one would fare there.
            self.estimator.observe_confidence(r.confidence[-1], aged=r.drafted > 0)
        if r.drafted == 0 and copied:
            self.estimator.forget(decision.source)
        if r.index > 0:
            # The first decode after a prefill is slow: not a cost any later round pays.
            costs.learn_verify(r.width or r.drafted + 1, r.verify_ms)
        self.speculating = (decision.copying, decision.source) if r.gamma > 0 else None
        if r.gamma == 0:
            self.zero_run += 1
        else:
            self.zero_run = 0
            if decision.probing:
                won = self.best_gamma(decision.copying, decision.behind, decision.source) > 0
                self.interval = (c.probe_every if won else min(self.interval * 2, c.probe_max))
