"""The adaptive controller: each round, the gamma (0 = plain decoding) that maximises expected
committed tokens per second. Three parts: the cost model prices a round (engine/control/costs.py),
the acceptance estimator predicts how many of its drafted tokens survive
(engine/control/estimator.py), and this chooser compares the predicted speed of every gamma from
one prediction of the round's plan (engine/round_plan.py), decides, and says why in one line.
What it learns is the drafter's evidence (engine/control/evidence.py), which holds the cost model
and the estimator: the pair keeps it across answers and hands it over with the drafter's
calibration (`use_calibration`, engine/knowledge.py); the controller holds that one handle. Its
constants are gathered in engine/control/constants.py; docs/design/controller.md is the reference
for the design and the measurements behind it.

Gamma is the most a round may draft: `keep_drafting` stops the draft earlier when the next
token is not worth its verify width and draft decode. Like every early stop it reads only what
comes before the token it decides on, which keeps the output exact (docs/EXACTNESS.md).

Exploration: when the estimate says plain wins, a round may still explore (draft `probe_gamma`
tokens) where drafting has a real chance to pay, and only within a budget:
- a real chance: at the optimistic end of the acceptance key's first-token acceptance (the
  Beta(1 + hits, 1 + misses) posterior over every round it drafted, mean plus `explore_z`
  standard deviations, at every position), some gamma pays by the carrying-on margin. Evidence that a key loses
  closes this for good; a key nothing is known of is open;
- a budget: what exploring rounds lost against plain decoding (measured), plus the predicted
  loss of this one, stays within `explore_share` of the plain-decoding time of every token
  committed under the same evidence. So exploration is at most that share of plain time over a
  long run, however many sources and match lengths there are (tests/test_controller.py).

In a batch (several sequences decoded in one step, engine/control/batch.py) the caller passes
what the other sequences put into the step (`next_gamma(plan, batch)`), and the round is priced
as the whole step at its total width: the gamma chosen is the one that makes the batch fastest
given the others (engine/control/costs.py has the formula and a worked example), so gamma
shrinks as the batch fills and drafting stops where it cannot pay ("plain: batch of 4: drafting
cannot pay at width 20"); a gamma must also beat the whole batch decoding plainly, so a batch
cannot settle drafting, slower than plain, because each sequence's mates draft. No probe runs
in a batch (every sequence would pay for it). Alone
(`ALONE`, the default) every price and decision is what it was before batches, to the bit.
`keep_drafting`, the cut within a round, still prices the round alone: it can only draft less
than the gamma chosen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from engine.control.batch import ALONE, Batch
from engine.control.constants import DEFAULTS, ControllerConstants
from engine.control.costs import Calibration, CostModel, calibrate
from engine.control.estimator import POSITIONS, AcceptanceEstimator, Counts
from engine.control.evidence import Evidence
from engine.control.policy import Decision, GammaPolicy
from engine.round_plan import (CONTEXT, HISTORY, MODEL, NO_PLAN, PREDICTION, RoundPlan,
                               match_bucket)
from engine.errors import SettingsError
from engine.generation_config import COPY_MAX, MAX_GAMMA
from engine.stats import ControllerReport, RoundStats

__all__ = ["AdaptiveController", "Calibration", "Prediction", "calibrate"]

# How a reason line names each source's evidence.
_SOURCE_WORDS = {MODEL: "the draft model", CONTEXT: "lookup", HISTORY: "the history",
                 PREDICTION: "the prediction"}


@dataclass(frozen=True)
class Prediction:
    """One round's prediction for every gamma 0..max: expected committed tokens and cost (ms),
    by the estimate and hopefully (untested positions may be better than their estimate)."""
    expected: np.ndarray
    ms: np.ndarray
    hopeful: np.ndarray
    hopeful_ms: np.ndarray
    # a_j by the estimate, per draft position.
    acceptance: np.ndarray
    # In a batch, the tokens the other sequences commit in the step, whose `ms` are then the
    # whole step's (engine/control/costs.py's T_o and R); 0 alone.
    others: float = 0.0
    # In a batch, the ms a token of every sequence decoding plainly (n tokens in a step of n
    # rows), and the others' draft decodes, which the step waits out as well (costs.py's P and
    # D_o); 0 alone.
    plain_pace: float = 0.0
    others_drafts: float = 0.0

    @property
    def speeds(self) -> np.ndarray:
        """Predicted tokens/s of every gamma: the batch's in a batch."""
        tokens = self.expected + self.others if self.others else self.expected
        return 1e3 * tokens / self.ms

    def over_plain_batch(self) -> np.ndarray:
        """In a batch, its speed at every gamma (the whole step: `ms` and the others' drafts)
        over every sequence decoding plainly."""
        return (self.others + self.expected) * self.plain_pace / (self.ms + self.others_drafts)

    def tokens_per_s(self, gamma: int) -> float:
        """This sequence's own predicted tokens/s drafting `gamma`."""
        return float(1e3 * self.expected[gamma] / self.ms[gamma])


class AdaptiveController(GammaPolicy):
    """Without costs at construction it is uncalibrated, and asks for a calibration
    (`calibration_need`) that `Pair.generate` supplies before the first round, with the
    drafter's evidence. Keyword `overrides` replace fields of `constants`.

    `update` writes what the rounds taught it, `next_gamma` only reads it, so any question
    (`predict`, `predicted_tps`, ...) gets the same answer whatever was asked before."""

    wants_confidence = True

    def __init__(self, max_gamma: int = 8, draft_ms: Sequence[float] | None = None,
                 verify_ms: Sequence[float] | None = None, model_name: str | None = None,
                 constants: ControllerConstants = DEFAULTS, **overrides) -> None:
        if not 1 <= max_gamma <= MAX_GAMMA:
            raise SettingsError(f"the adaptive controller needs max gamma between 1 and "
                                f"{MAX_GAMMA}, got {max_gamma}")
        try:
            c = replace(constants, **overrides)
        except TypeError as exc:
            raise SettingsError(f"unknown controller setting: {exc}") from None
        if c.opening_plain < 0:
            raise SettingsError(f"plain opening tokens must be >= 0, got {c.opening_plain}")
        self.name = "adaptive"
        self.constants = c
        self.max_gamma = max_gamma
        self.model_name = model_name
        # What the controller learns and reads: the cost model, the estimator and the
        # exploration ledger (its own until `use_calibration` hands it the drafter's).
        self.evidence = Evidence()
        self.evidence.adopt(c)
        # The acceptance key the last round drafted under (None when it was plain).
        self.speculating: str | None = None
        # Rounds and committed tokens so far in this answer, and the rounds each key drafted
        # in it (the rest of a key's rounds are earlier answers' evidence).
        self.rounds = 0
        self.elapsed = 0
        self.drafted_here: dict[str, int] = {}
        # The copying parts that planned a round in this answer (the report prices them).
        self.copy_parts: set[str] = set()
        # Plain rounds since the target's confidence was last read (`confidence_every`).
        self._unread = 0
        # Per copy key: its counts, their first hits and `_loses`' two acceptances; its line.
        self._ceilings: dict[str, _Bounds] = {}
        # The copy a plain round was offered and did not draft, followed over the plain rounds
        # after it as if it had been drafted (`_watch`): its key, tokens and how many of them
        # the text has matched so far.
        self._watched: tuple[str, tuple[int, ...], int] | None = None
        self._losing_reasons: dict[str, tuple[tuple[float, int, int], str]] = {}
        # `_model_pays`' bounds per margin, for the costs' shape they were found at.
        self._floors_stamp: tuple[int, int] = (-1, -1)
        self._floors: dict[float, tuple[float, float]] = {}
        if verify_ms is not None:
            self.use_calibration(Calibration(
                list(draft_ms if draft_ms is not None else [0.0] * len(verify_ms)),
                list(verify_ms), model_name), self.evidence)

    @property
    def estimator(self) -> AcceptanceEstimator:
        """The evidence's acceptance estimator (made when the evidence was adopted)."""
        estimator = self.evidence.estimator
        assert estimator is not None
        return estimator

    @property
    def costs(self) -> CostModel | None:
        """The evidence's cost model (None until calibrated)."""
        return self.evidence.costs

    @property
    def calibrated(self) -> bool:
        return self.evidence.costs is not None

    def calibration_need(self) -> int | None:
        # The widest round: a copy's (COPY_MAX tokens and the last committed one).
        return None if self.calibrated else max(self.max_gamma, COPY_MAX)

    @property
    def opening_plain(self) -> int:
        return self.constants.opening_plain

    def use_calibration(self, calibration: Calibration, evidence: Evidence) -> None:
        """Take the drafter's costs and its evidence: this controller starts from what earlier
        answers learned and adds to it."""
        evidence.begin_answer(calibration, self.constants)
        self.evidence = evidence
        self.model_name = calibration.model_name

    def _costs(self) -> CostModel:
        costs = self.evidence.costs
        if costs is None:
            raise SettingsError("the adaptive controller has no calibration; "
                                "run it through Pair.generate or pass draft_ms/verify_ms")
        return costs

    # Prediction ---------------------------------------------------------------------------

    def _rounds_ahead(self, expected: np.ndarray) -> np.ndarray:
        """Rounds over which a resumption's catch-up is spread, for rounds expected to commit
        `expected` tokens: at least `horizon`, and as many as the answer so far would fill (up
        to `horizon_cap` tokens). The length so far is the only guess of what remains (Gott's
        rule); early in an answer it may be about to end, so resuming must pay quickly."""
        c = self.constants
        if c.horizon_cap <= 0:
            return np.full(np.shape(expected), c.horizon)
        return np.maximum(c.horizon, min(self.elapsed, c.horizon_cap) / expected)

    def most(self, plan: RoundPlan) -> int:
        """The most the round `plan` describes may draft: a copy its own tokens, up to
        COPY_MAX; the model `max_gamma`."""
        return min(len(plan.tokens), COPY_MAX) if plan.is_copy else self.max_gamma

    def predict(self, plan: RoundPlan, batch: Batch = ALONE) -> Prediction:
        """The round `plan` describes, priced for every gamma 0..`most(plan)` at once, by the
        estimate and hopefully; in a batch, as the whole step at its total width, so that the
        speeds compared are the batch's (engine/control/costs.py). A copy's acceptance pools
        every position its key has counted, whatever its length."""
        costs = self._costs()
        n = self.most(plan)
        if plan.is_copy:
            a, expected, hopeful = self.estimator.expected(
                plan.acceptance_key, POSITIONS, self._opening_cap(), self.constants.hope)
            a, expected, hopeful = a[:n], expected[:n + 1], hopeful[:n + 1]
        else:
            a, expected, hopeful = self.estimator.expected(
                plan.acceptance_key, n, self._opening_cap(), self.constants.hope)
        if not batch.alone:
            return self._predict_in(batch, plan, a, expected, hopeful)
        if not plan.model_drafts:
            ms = costs.round_ms(n, False)
            return Prediction(expected, ms, hopeful, ms, a)
        # The model's decodes, and the share of its catch-up charged to this round.
        catch_up = costs.catch_up_ms(max(plan.behind, 1))
        c = self.constants
        span = min(self.elapsed, c.horizon_cap) if c.horizon_cap > 0 else 0.0
        if not catch_up or span <= 0:
            # The share is the same for every gamma: catch_up / horizon.
            ms = costs.round_ms(n, True, catch_up / c.horizon)
            return Prediction(expected, ms, hopeful, ms, a)
        # catch_up / _rounds_ahead(E), written as a minimum (E >= 1, so span / E is finite).
        per_token, most = catch_up / span, catch_up / c.horizon
        return Prediction(expected, costs.round_ms(n, True, np.minimum(expected * per_token, most)),
                          hopeful, costs.round_ms(n, True, np.minimum(hopeful * per_token, most)),
                          a)

    def _predict_in(self, batch: Batch, plan: RoundPlan, a: np.ndarray, expected: np.ndarray,
                    hopeful: np.ndarray) -> Prediction:
        """`predict` in a batch: the step R(g), for both predictions."""
        costs = self._costs()
        both = np.stack((expected, hopeful))
        share = (costs.catch_up_ms(max(plan.behind, 1)) / self._rounds_ahead(both)
                 if plan.model_drafts else 0.0)
        ms, hopeful_ms = np.broadcast_to(
            costs.step_ms(len(a), plan.model_drafts, batch, share), both.shape)
        n = batch.sequences
        return Prediction(expected, ms, hopeful, hopeful_ms, a, batch.others_commit,
                          costs.verify_cost(n) / n, costs.others_draft_ms(batch))

    def _opening_cap(self) -> float:
        """The most acceptance this round may be judged at: the opening's, early on."""
        opening = self.constants.opening
        return opening[self.rounds] if self.rounds < len(opening) else 1.0

    def acceptance(self, plan: RoundPlan) -> np.ndarray:
        """Estimated a_j per draft position for the round `plan` describes."""
        return self.estimator.acceptance(plan.acceptance_key)[:self.most(plan)]

    def predicted_tps(self, gamma: int, plan: RoundPlan, batch: Batch = ALONE) -> float:
        return float(self.predict(plan, batch).speeds[gamma])

    def cost_ms(self, gamma: int, plan: RoundPlan, batch: Batch = ALONE) -> float:
        return float(self.predict(plan, batch).ms[gamma])

    # Choice -------------------------------------------------------------------------------

    def _pays(self, g: int, expected: np.ndarray, ms: np.ndarray, margin: float,
              others: float = 0.0, plain_pace: float = 0.0, others_drafts: float = 0.0) -> bool:
        """Whether drafting `g` is predicted to save more than `margin` of what its round loses
        when nothing is accepted (its cost over a plain token's): a choice's hysteresis in
        units of its own risk, the same on any verify curve. In a batch, where the others
        commit `others` tokens in a step of `ms`: the time the batch's tokens would take at a
        plain step's pace, against the step's; and at `plain_pace`, every sequence decoding
        plainly, against the whole step's, the others' draft decodes included (engine/control/
        costs.py: each sequence answering the others alone can keep a batch drafting because
        the others do, slower than all plain)."""
        saved = (others + expected[g]) * ms[0] / (others + 1.0) - ms[g]
        risk = margin * (ms[g] - ms[0])
        if not (saved > 0 and saved > risk):
            return False
        if not plain_pace:
            return True
        whole = (others + expected[g]) * plain_pace - ms[g] - others_drafts
        return whole > 0 and whole > risk

    def best_gamma(self, plan: RoundPlan, batch: Batch = ALONE) -> int:
        return self._choose(plan, self.predict(plan, batch))

    def _choose(self, plan: RoundPlan, p: Prediction) -> int:
        """How far to draft is chosen hopefully (positions a round has not tested may be better
        than their estimate), whether to draft on the estimate itself; the best gamma by the
        estimate is the fallback, and then the best by the estimate of those that pay: the
        margin is in units of a round's risk, which grows with gamma, so a shorter round can pay
        where the fastest does not (on the measured H200 curve, a draft at 0.50 of a target
        token: gamma 1 pays after plain rounds at acceptance 0.89 where gamma 2, the fastest,
        misses by 2%). So the round drafts whenever some gamma pays, as `_loses` and
        `could_pay` assume."""
        margin = self._margin(plan)
        for e, m in ((p.hopeful, p.hopeful_ms), (p.expected, p.ms)):
            # (Alone, the others' tokens are skipped, not added: this runs every round.)
            g = int(((e[1:] + p.others if p.others else e[1:]) / m[1:]).argmax()) + 1
            if self._pays(g, p.expected, p.ms, margin, p.others, p.plain_pace, p.others_drafts):
                return g
        return _best_paying(p, margin)

    def optimistic_acceptance(self, plan: RoundPlan) -> float:
        """The optimistic end of the plan's first-token acceptance: the mean of its Beta(1 +
        hits, 1 + misses) posterior over every round it drafted, plus `explore_z` standard
        deviations."""
        counts = self.estimator.counts(plan.acceptance_key)
        h, n = counts.first_hits, counts.rounds
        alpha, beta = 1.0 + h, 1.0 + n - h
        mean = alpha / (alpha + beta)
        sd = math.sqrt(alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1.0)))
        return min(mean + self.constants.explore_z * sd, 1.0)

    def could_pay(self, plan: RoundPlan, ms: np.ndarray) -> bool:
        """Whether some gamma pays by the carrying-on margin at the optimistic acceptance, at
        every position: when not, exploring can only lose."""
        costs = ms.tolist()
        return _first_paying(self.optimistic_acceptance(plan), costs,
                             self.constants.margin) < len(costs)

    def _margin(self, plan: RoundPlan) -> float:
        """The margin a gamma must pay by (`_pays`) to draft the round `plan` describes."""
        # Starting again after plain rounds bets on an estimate partly made of the target's
        # confidence, so it needs a larger predicted saving than carrying on does; so does the
        # model after a copy (its estimate and its catch-up were not just tested).
        carrying_on = self.speculating is not None and (plan.is_copy
                                                        or self.speculating == MODEL)
        return self.constants.margin if carrying_on else self.constants.resume_margin

    def _loses(self, plan: RoundPlan) -> float | None:
        """For a copy whose key has been seen in `lose_after` rounds or more: the most
        acceptance its estimate can give any position, when at that acceptance no gamma up to
        the copy's length pays by the round's margin, and none pays by the carrying-on margin
        at its optimistic first-token acceptance either; for the model, `_model_loses`; None
        otherwise. The round is then plain and explores nothing, as the full prediction would
        say (`_choose` and `could_pay` ask whether some gamma pays, and more acceptance only
        pays more), so the prediction is skipped. Thinner evidence never switches a copy off:
        its rounds are predicted in full.

        Both acceptances only fall until the key's next first-token hit (a miss lowers the
        first position's rate and the posterior's bound, forgetting scales the counts alike):
        kept per key until then, with the shortest gamma each pays at, which depends on the
        verify curve's shape alone (`CostModel.shape`), not on the machine's pace."""
        if plan.model_drafts:
            return self._model_loses(plan)
        if not plan.is_copy:
            return None
        key = plan.acceptance_key
        counts = self.estimator.counts(key)
        if counts.rounds < self.constants.lose_after:
            return None
        costs = self._costs()
        n = self.most(plan)
        kept = self._ceilings.get(key)
        prior = self.estimator.prior(key)
        if kept is not None and (kept.counts is not counts or kept.hits != counts.first_hits
                                 or kept.prior != prior):
            # A first-token hit (or counts restored from disk, or a shorter match's evidence
            # raising the key's prior) may raise the bounds.
            kept = None
        if (kept is not None and kept.rounds != counts.rounds
                and not self._closes(kept, costs, plan, n)):
            # Misses since may have lowered them enough to close.
            kept = None
        if kept is None:
            kept = self._ceilings[key] = _Bounds(
                counts, counts.first_hits, counts.rounds,
                self.estimator.ceiling(key, POSITIONS), self.optimistic_acceptance(plan), prior)
        return kept.ceiling if self._closes(kept, costs, plan, n) else None

    def _model_loses(self, plan: RoundPlan) -> float | None:
        """For the model, alone: the most acceptance its estimate gives any position, when at
        that acceptance no gamma pays by the round's margin even without its catch-up, and
        exploring could not pay either (no budget, or no gamma pays at the optimistic
        acceptance); None otherwise. Its estimate moves every few plain rounds (the target's
        confidence), so this is asked afresh each round: a few Python floats where the full
        prediction is a dozen array operations, and the same decision (the catch-up only
        makes a round dearer)."""
        c = self.constants
        top = self.estimator.top(plan.acceptance_key, self.max_gamma)
        if self._model_pays(top, self._margin(plan)):
            return None
        ev = self.evidence
        if ev.explored_ms < c.explore_share * ev.plain_ms and self._model_pays(
                self.optimistic_acceptance(plan), c.margin):
            return None
        return top

    def _model_pays(self, a: float, margin: float) -> bool:
        """Whether some model round up to `max_gamma` pays by `margin` (without its catch-up)
        with every position accepted at `a`: `_first_paying` on the model's round costs. Paying
        only grows with `a`, so each margin keeps the bounds of the acceptance where paying
        starts until the costs change shape (`CostModel.shape`, `draft_shape`; a plain round
        scales them all alike): outside them the answer is known, inside it is computed."""
        costs = self._costs()
        stamp = (costs.shape, costs.draft_shape)
        if self._floors_stamp != stamp:
            self._floors_stamp, self._floors = stamp, {}
        bounds = self._floors.get(margin)
        if bounds is None:
            bounds = self._floors[margin] = _paying_bounds(
                self._model_round_costs(costs), margin, self.max_gamma)
        lo, hi = bounds
        if a <= lo:
            return False
        if a >= hi:
            return True
        return _first_paying(a, self._model_round_costs(costs), margin) <= self.max_gamma

    def _model_round_costs(self, costs: CostModel) -> list[float]:
        """A model round's cost at gamma 0..max_gamma, catch-up left out (plain floats)."""
        n = self.max_gamma
        verify = costs.verify_costs(n + 1).tolist()
        step = costs.draft_token
        return [verify[0]] + [verify[g] + g * step for g in range(1, n + 1)]

    def _closes(self, kept: "_Bounds", costs: CostModel, plan: RoundPlan, n: int) -> bool:
        """Whether at `kept`'s bounds no gamma up to `n` pays (`_loses`)."""
        if kept.shape != costs.shape:
            kept.first.clear()
            kept.shape = costs.shape
        margin = self._margin(plan)
        widest = COPY_MAX + 1
        for a, m in ((kept.ceiling, margin), (kept.optimistic, self.constants.margin)):
            g = kept.first.get((a, m))
            if g is None:
                g = kept.first[(a, m)] = _first_paying(a, costs.verify_costs(widest).tolist(), m)
            if g <= n:
                return False
        return True

    def _explores(self, plan: RoundPlan, g: int, ms: np.ndarray) -> bool:
        """Whether to spend an exploring round of `g` tokens on `plan` (the module docstring's
        rule): a real chance that drafting pays, within the exploration budget."""
        ev = self.evidence
        budget = self.constants.explore_share * ev.plain_ms
        if ev.explored_ms >= budget:
            return False
        spend = ev.explored_ms + max(float(ms[g] - ms[0]), 0.0)
        if plan.model_drafts:
            # The probe pays the whole catch-up, not the share a resumption is charged.
            spend += self._costs().catch_up_ms(max(plan.behind, 1))
        return spend <= budget and self.could_pay(plan, ms)

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        c = self.constants
        if not plan.drafts:
            # Nothing to draft from: a plain round, priced without a prediction.
            one = self._costs().verify_costs(1)[0]
            return Decision(0, plan, prediction=1e3 / one,
                            reason="plain: nothing to draft from this round",
                            confidence=self._unread + 1 >= c.confidence_every, batch=batch)
        if self.rounds >= max(c.opening_plain, len(c.opening)):
            top = self._loses(plan) if plan.is_copy or batch.alone else None
            if top is not None:
                one = self._costs().verify_costs(1)[0]
                return Decision(0, plan, prediction=1e3 / one,
                                reason=self._losing_reason(plan, top),
                                confidence=self._unread + 1 >= c.confidence_every, batch=batch)
        p = self.predict(plan, batch)
        speeds = p.speeds.tolist()
        probing = False
        if self.rounds < c.opening_plain:
            g = 0
        else:
            g = self._choose(plan, p)
            # A probe in a batch would be paid by every sequence in it: none there.
            if g == 0 and batch.alone and self.rounds >= len(c.opening):
                probe = min(c.probe_gamma, len(p.ms) - 1)
                if self._explores(plan, probe, p.ms):
                    g, probing = probe, True
        # In a batch `speeds` are the batch's: the prediction is this sequence's own.
        prediction = float(speeds[g]) if batch.alone else p.tokens_per_s(g)
        return Decision(g, plan, prediction=prediction,
                        reason=self._reason(g, plan, probing, speeds, p.acceptance, batch,
                                            None if batch.alone else p.over_plain_batch()),
                        probing=probing, speeds=tuple(speeds),
                        confidence=g > 0 or self._unread + 1 >= c.confidence_every, batch=batch)

    def _earlier(self, plan: RoundPlan) -> str:
        """What earlier answers taught of this plan's key, when the decision rests on it:
        "lookup at 2-token matches: 0.41 accepted over 312 rounds"."""
        key = plan.acceptance_key
        counts: Counts = self.estimator.counts(key)
        if counts.rounds <= self.drafted_here.get(key, 0):
            return ""
        what = _SOURCE_WORDS.get(plan.source, plan.source)
        if plan.is_copy:
            what += f" at {match_bucket(plan.match)}-token matches"
        return (f"; earlier answers: {what}: {counts.first_hits / counts.rounds:.2f} accepted "
                f"over {counts.rounds} rounds")

    def _losing_reason(self, plan: RoundPlan, top: float) -> str:
        """The line of a copy's round that `_loses`: kept per key until its evidence changes."""
        if plan.model_drafts:
            return (f"plain: the draft costs {self._costs().draft_relative():.2f} of a target "
                    f"token; no gamma pays at up to {min(top, 1.0):.2f} accepted a token"
                    f"{self._earlier(plan)}")
        key = plan.acceptance_key
        rounds = self.estimator.counts(key).rounds
        stamp = (top, self.drafted_here.get(key, 0), rounds)
        kept = self._losing_reasons.get(key)
        if kept is None or kept[0] != stamp:
            # The rounds it rests on: earlier answers' and this one's, or this one's alone.
            earlier = self._earlier(plan) or f" over {rounds} rounds"
            line = (f"plain: copying from {_copy_words(plan)} at {match_bucket(plan.match)}-token "
                    f"matches cannot pay (at most {min(top, 1.0):.2f} accepted a token)"
                    f"{earlier}")
            kept = self._losing_reasons[key] = (stamp, line)
        return kept[1]

    def _reason(self, g: int, plan: RoundPlan, probing: bool, speeds: list[float],
                a: np.ndarray, batch: Batch = ALONE,
                over_plain: np.ndarray | None = None) -> str:
        """One line on the choice of `g`, from the predictions that made it (`speeds` of every
        gamma, nine floats: plain Python); in a batch, the batch's size and the step's width at
        `g` lead it, and its speedups are the batch's (`speeds` are the batch's tokens/s there;
        a plain line's, the lesser of that and `over_plain`, over every sequence plain)."""
        line = self._reason_alone(g, plan, probing, speeds, a)
        opening = self.rounds < self.constants.opening_plain or (g == 0
                                                                and self._opening_cap() < 1.0)
        if batch.alone or opening:
            return line
        if g == 0:
            best = max(range(1, len(speeds)), key=speeds.__getitem__)
            gain = speeds[best] / speeds[0]
            if over_plain is not None:
                gain = min(gain, float(over_plain[best]))
            return (f"plain: batch of {batch.sequences}: drafting cannot pay at width "
                    f"{batch.width}; best predicted {gain:.2f}x at gamma "
                    f"{best}{self._earlier(plan)}")
        return (f"batch of {batch.sequences} at width {batch.width + g}, speedups the batch's: "
                f"{line}")

    def _reason_alone(self, g: int, plan: RoundPlan, probing: bool, speeds: list[float],
                      a: np.ndarray) -> str:
        """The line `_reason` gives a round with the models to itself."""
        c = self.constants
        best = max(range(1, len(speeds)), key=speeds.__getitem__)
        gain = [v / speeds[0] for v in speeds]
        a0 = float(a[0])
        if self.rounds < c.opening_plain:
            return (f"plain: opening round {self.rounds + 1} of {c.opening_plain} (the "
                    "target shows how predictable the answer is before the draft is tried)")
        if g == 0 and self._opening_cap() < 1.0:
            return (f"plain: the answer's opening, where drafts are accepted at most "
                    f"{self._opening_cap():.2f}; best predicted {gain[best]:.2f}x at gamma {best}")
        earlier = self._earlier(plan)
        if probing:
            return (f"explore: gamma {g} to measure {_SOURCE_WORDS.get(plan.source, '')} again "
                    f"(predicted {gain[g]:.2f}x){earlier}")
        if plan.is_copy:
            what = f"copying from {_copy_words(plan)}, which costs no draft decode"
            if g == 0:
                seen = self.estimator.counts(plan.acceptance_key).rounds
                thin = (f"; {seen} of the {c.lose_after} rounds seen that could switch it off"
                        if seen < c.lose_after else "")
                return (f"plain: best predicted {gain[best]:.2f}x at gamma {best}, {what}"
                        f"{earlier}{thin}")
            return (f"gamma {g}: predicted {gain[g]:.2f}x (first-token acceptance {a0:.2f}, "
                    f"{what}){earlier}")
        cost = self._costs().draft_relative()
        if g == 0:
            return (f"plain: the draft costs {cost:.2f} of a target token; best predicted "
                    f"{gain[best]:.2f}x at gamma {best}{earlier}")
        return (f"gamma {g}: predicted {gain[g]:.2f}x (first-token acceptance {a0:.2f}, the "
                f"draft {cost:.2f} of a target token){earlier}")

    def finish(self) -> None:
        self._stop_watching()
        self.evidence.answered()

    def report(self, decision: Decision) -> ControllerReport:
        costs = self._costs()
        draft = {}
        if self.model_name:
            draft[self.model_name] = round(costs.draft_relative(), 4)
        plan = decision.plan
        for part in sorted(self.copy_parts):
            draft[part] = 0.0
        if decision.speeds:
            speeds = np.array(decision.speeds)
        elif plan.drafts:
            # A copy known to lose was decided without a prediction: the one made now, from
            # what the answer's rounds taught since, stands for it.
            speeds = self.predict(plan).speeds
        else:
            speeds = 1e3 / np.ones(self.max_gamma + 1)
        return ControllerReport(
            policy=self.name, gamma=decision.gamma, reason=decision.reason,
            source=plan.drafter if plan.drafts else "",
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
        plan = decision.plan
        key = plan.acceptance_key
        ev = self.evidence
        self.rounds += 1
        # Tokens a grammar forced come free whatever the policy chose: the round is judged on
        # the rest.
        committed = max(r.committed - r.forced, 0)
        self.elapsed += committed
        if plan.is_copy:
            self.copy_parts.add(plan.drafter)
        plain_token = float(costs.verify_costs(1)[0])
        ev.plain_ms += committed * plain_token
        if decision.probing:
            ev.explored_ms += max(r.draft_ms + r.verify_ms - committed * plain_token, 0.0)
        alone = decision.batch.alone
        if r.drafted > 0:
            # In a batch a draft depth is decoded with the others' drafts: its time is not this
            # draft's per-token cost, which only rounds alone teach.
            if plan.model_drafts and alone:
                costs.learn_draft(r.draft_ms, r.drafted, max(plan.behind, 1))
            self.estimator.learn(key, r.drafted, r.accepted, r.confidence)
            self.drafted_here[key] = self.drafted_here.get(key, 0) + 1
        if r.confidence and (r.drafted == 0 or (plan.model_drafts and r.accepted == r.drafted)):
            # The bonus row after a fully accepted draft, like a plain round's row, is a
            # position no draft was tested on: its confidence says how one would fare there.
            # A plain round's reading stands for the plain rounds that read none.
            self.estimator.observe_confidence(r.confidence[-1], aged=r.drafted > 0,
                                              rounds=1 if r.drafted else self._unread + 1)
        if r.drafted == 0:
            self._unread = 0 if r.confidence else self._unread + 1
        if r.drafted == 0 and r.token is not None and not r.forced:
            self._watch(plan, r.token)
        else:
            self._stop_watching()
            if r.drafted == 0 and plan.is_copy:
                # Nothing tells how the copy would have fared: its evidence ages.
                self.estimator.forget(key)
        if r.index > 0:
            # The first decode after a prefill is slow: not a cost any later round pays. In a
            # batch the round's verify is the step's, at the width the decision saw it.
            width = r.width or r.drafted + 1
            costs.learn_verify(width if alone else width + decision.batch.other_width,
                               r.verify_ms)
        self.speculating = (MODEL if plan.model_drafts else key) if r.gamma > 0 else None

    def _watch(self, plan: RoundPlan, token: int) -> None:
        """A plain round committed `token` after `plan`. A copy that was offered and not drafted
        is watched: the plain rounds after it are judged as its drafted tokens would have been,
        and when the text leaves the copy (or the copy ends) its key learns the round it would
        have been. A one-hot draft token x is accepted with probability p(x), the chance a
        plain round commits x, so a watched copy is evidence of the same law as a drafted one,
        got for nothing; it reads committed tokens only (docs/EXACTNESS.md)."""
        watched = self._watched
        fresh = watched is None
        if watched is None:
            if not plan.is_copy or not plan.tokens:
                return
            watched = (plan.acceptance_key, plan.tokens[:self.most(plan)], 0)
        key, tokens, matched = watched
        self._watched = None
        if token == tokens[matched]:
            matched += 1
            if matched < len(tokens):
                # Each matched token is learned as it comes (the round left open), so a long
                # copy the text follows teaches its key before the copy ends.
                self.estimator.learn(key, matched, matched, start=matched - 1, done=False)
                self._watched = (key, tokens, matched)
                return
            counted = matched - 1
        else:
            counted = matched
        self._learn(key, len(tokens), matched, start=counted)
        if matched < len(tokens) and not fresh:
            # The round's own copy is judged by the same token, from its start.
            self._watch(plan, token)

    def _stop_watching(self) -> None:
        """The watched copy can no longer be followed (a round drafted or forced tokens, or the
        answer ended): its key learns the tokens it matched so far, as a round that drafted
        those alone."""
        if self._watched is not None:
            key, _, matched = self._watched
            self._watched = None
            if matched:
                self._learn(key, matched, matched, start=matched)

    def _learn(self, key: str, drafted: int, accepted: int, start: int = 0) -> None:
        self.estimator.learn(key, drafted, accepted, start=start)
        self.drafted_here[key] = self.drafted_here.get(key, 0) + 1


def _copy_words(plan: RoundPlan) -> str:
    """Where a copy comes from, as reason lines say it ("the prediction": a source by its name)."""
    return {HISTORY: "past requests", CONTEXT: "the context"}.get(plan.source,
                                                                  f"the {plan.source}")


@dataclass
class _Bounds:
    """`_loses`' bounds of one copy key: the counts they were taken from, with their first hits
    and rounds then, and the key's prior; the most any position's estimate can be and the optimistic first-token
    acceptance; and, for the verify curve's shape `shape`, the shortest gamma that pays at
    each (acceptance, margin)."""
    counts: Counts
    hits: int
    rounds: int
    ceiling: float
    optimistic: float
    # The key's prior when they were taken (`AcceptanceEstimator.prior`).
    prior: float = 0.0
    shape: int = -1
    first: dict[tuple[float, float], int] = field(default_factory=dict)


def _first_paying(a: float, costs: list[float], margin: float) -> int:
    """The shortest gamma that pays by `margin` (as `_pays` judges) with every position accepted
    at `a`, on round costs `costs` of gamma 0..max (plain Python floats); len(costs) when none
    does. Costs scaled alike give the same answer."""
    one = costs[0]
    expected, chain = 1.0, 1.0
    for g in range(1, len(costs)):
        chain *= a
        expected += chain
        cost = costs[g]
        saved = expected * one - cost
        if saved > 0 and saved > margin * (cost - one):
            return g
    return len(costs)


def _paying_bounds(costs: list[float], margin: float, n: int,
                   steps: int = 48) -> tuple[float, float]:
    """(lo, hi): at an acceptance of `lo` or less no gamma up to `n` pays by `margin` on round
    costs `costs` (`_first_paying`), at `hi` or more one does; found by bisection, which holds
    because paying only grows with the acceptance (every E(g) does).

    >>> lo, hi = _paying_bounds([1.0, 1.5, 2.0], 0.1, 2)
    >>> _first_paying(lo, [1.0, 1.5, 2.0], 0.1), _first_paying(hi, [1.0, 1.5, 2.0], 0.1)
    (3, 1)
    >>> 0.0 < lo < hi < 1.0 and hi - lo < 1e-12
    True
    """
    if _first_paying(0.0, costs, margin) <= n:
        return -math.inf, 0.0
    if _first_paying(1.0, costs, margin) > n:
        return 1.0, math.inf
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if _first_paying(mid, costs, margin) <= n:
            hi = mid
        else:
            lo = mid
    return lo, hi


def _best_paying(p: Prediction, margin: float) -> int:
    """The fastest gamma by `p`'s estimate of those that pay by `margin` (as `_pays` judges
    each), or 0 when none does."""
    expected, ms, others = p.expected, p.ms, p.others
    saved = (others + expected) * ms[0] / (others + 1.0) - ms
    risk = margin * (ms - ms[0])
    pays = (saved > 0) & (saved > risk)
    if p.plain_pace:
        whole = (others + expected) * p.plain_pace - ms - p.others_drafts
        pays &= (whole > 0) & (whole > risk)
    pays[0] = False
    if not pays.any():
        return 0
    return int(np.where(pays, (others + expected) / ms, -np.inf).argmax())
