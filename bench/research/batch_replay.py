"""The adaptive controller's decisions in a batch (issue 46), replayed on the cost profiles of
bench/fakes/costed.py (the measured GPU profile, this 2-core CPU as calibrated) and on this CPU's curve for rows of
several sequences (`CPU_BATCHED`), widths past the nine given extrapolated linearly, as the cost
model does: for batches of 1, 2, 4 and 8 sequences, each
drafting from the same source at the same acceptance, the gamma every sequence settles on, the
step's width, and the predicted tokens/s per sequence and for the batch, against plain batched
decoding and against every sequence drafting what it would draft alone (llama-server's slots
draft whatever the batch).

  .venv/bin/python -m bench.research.batch_replay [ACCEPTANCE]

A sequence's decision depends on what the others put into the step, so the batch settles where
no sequence changes its mind: each in turn takes the controller's decision against the others'
gammas, from every sequence drafting its alone gamma (`settle`). The settled gammas need not be
equal: on a steep curve one sequence drafting can pay where two cannot. The step's time is
computed exactly from the profile (the target at the step's width, the draft one batch per
depth); tokens are the controller's expectation at the acceptance (no clock, no noise).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from engine.control.batch import Batch, Share, among
from engine.control.controller import AdaptiveController
from engine.control.costs import at_width
from engine.control.policy import Decision
from engine.round_plan import CONTEXT, MODEL, RoundPlan
from engine.stats import RoundStats
from bench.ceiling import TYPICAL_ACCEPTANCE
from bench.fakes.costed import CPU, GPU, MAX_GAMMA, Profile

# This 2-core CPU with the rows of several sequences in a step (issue 46's measurement: k
# sequences' rows cost 1.00, 1.77, 2.53, 3.90 of one, k = 1..4, more than one sequence's k rows,
# 1.42, 1.92, 2.85; past 4 at their mean step), the draft as on CPU. The cost model has one
# verify curve, so this one prices a sequence alone too: a bound on what batching gains here.
CPU_BATCHED = Profile("cpu-batched", tuple(10.0 * r for r in (1.0, 1.77, 2.53, 3.90, 4.87, 5.84,
                                                              6.81, 7.78, 8.75)), CPU.draft,
                      "this 2-core CPU's rows of several sequences (issue 46), a target token 10 ms")
PROFILES = (GPU, CPU, CPU_BATCHED)
BATCHES = (1, 2, 4, 8)
# The two ways of drafting: the draft model (in step with the text), and a copy from the
# context (prompt lookup at a long match: no draft decode).
PLANS = {"draft model": RoundPlan(MODEL, "draft-model", behind=1),
         "lookup": RoundPlan(CONTEXT, "prompt-lookup", tokens=(1,) * MAX_GAMMA, match=8)}
# The evidence the replayed controller starts from: this many rounds at the given acceptance at
# every draft position (the estimate then sits at the acceptance, whatever the prior).
EVIDENCE_ROUNDS = 1000


def steady(profile: Profile, plan: RoundPlan, acceptance: float) -> AdaptiveController:
    """A controller past its answer's opening, carrying on drafting from `plan`'s source, whose
    evidence says each drafted token is accepted with probability `acceptance`."""
    c = AdaptiveController(max_gamma=MAX_GAMMA, draft_ms=profile.draft, verify_ms=profile.verify,
                           model_name="draft-model", opening=())
    costs = c.costs
    assert costs is not None
    # One drafting round at the calibrated costs (it moves no cost): the controller now carries
    # on drafting from the source.
    c.update(Decision(2, plan), RoundStats(
        index=1, gamma=2, drafted=2, accepted=2, kind="x", committed=3,
        draft_ms=2 * costs.draft_token if plan.model_drafts else 0.0,
        verify_ms=costs.verify_cost(3), source=plan.drafter))
    n = EVIDENCE_ROUNDS
    counts = {"tries": [float(n)] * MAX_GAMMA, "hits": [n * acceptance] * MAX_GAMMA,
              "rounds": n, "first_hits": round(n * acceptance)}
    c.estimator.restore({"keys": {plan.acceptance_key: counts}, "scale_hits": 0.0,
                         "scale_conf": 0.0})
    return c


@dataclass(frozen=True)
class Row:
    sequences: int
    # Each sequence's gamma where the batch settles, largest first.
    gammas: tuple[int, ...]
    # The step's target width then.
    width: int
    # Tokens/s: the mean sequence's and the batch's; the batch's decoding plainly, and with
    # every sequence drafting what it would alone.
    per_sequence: float
    aggregate: float
    plain: float
    as_alone: float
    reason: str


class Step:
    """The exact cost of one step of n sequences drafting `gammas` from one source, and what
    each of them sees of the others (`batch_of`)."""

    def __init__(self, c: AdaptiveController, plan: RoundPlan) -> None:
        self.c = c
        self.plan = plan
        self.costs = c.costs
        assert self.costs is not None
        self.expected = c.predict(plan).expected

    def batch_of(self, gammas: list[int], i: int) -> Batch:
        model = self.plan.model_drafts
        return among([Share(g + 1, float(self.expected[g]), g if model else 0)
                      for g in gammas[:i] + gammas[i + 1:]])

    def ms(self, gammas: list[int]) -> float:
        """The target's decode at the step's width, and the draft model's batch per depth."""
        costs = self.costs
        ms = costs.verify_cost(sum(g + 1 for g in gammas))
        if self.plan.model_drafts:
            pace = costs.draft_token / costs.draft_batch[0]
            for depth in range(1, max(gammas) + 1):
                ms += pace * at_width(costs.draft_batch, sum(g >= depth for g in gammas))
        return ms

    def speeds(self, gammas: list[int]) -> tuple[float, float]:
        """(tokens/s of the mean sequence, of the batch)."""
        total = 1e3 * sum(self.expected[g] for g in gammas) / self.ms(gammas)
        return total / len(gammas), total


def settle(step: Step, n: int, start: int) -> tuple[list[int], Decision]:
    """Every sequence starting at gamma `start`, each in turn takes the controller's decision
    against what the others draft, until none changes (or 64 sweeps): the gammas, and the
    last sequence's decision."""
    gammas = [start] * n
    last = step.c.next_gamma(step.plan, step.batch_of(gammas, n - 1))
    for _ in range(64):
        changed = False
        for i in range(n):
            d = step.c.next_gamma(step.plan, step.batch_of(gammas, i))
            changed |= d.gamma != gammas[i]
            gammas[i], last = d.gamma, d
        if not changed:
            break
    return gammas, last


def replay(profile: Profile, plan: RoundPlan, acceptance: float) -> list[Row]:
    c = steady(profile, plan, acceptance)
    step = Step(c, plan)
    alone = c.next_gamma(plan).gamma
    rows = []
    for n in BATCHES:
        gammas, d = settle(step, n, alone)
        one, total = step.speeds(gammas)
        rows.append(Row(n, tuple(sorted(gammas, reverse=True)), sum(g + 1 for g in gammas),
                        one, total, step.speeds([0] * n)[1], step.speeds([alone] * n)[1],
                        d.reason))
    return rows


def main(acceptance: float) -> None:
    print(f"Acceptance {acceptance} per drafted token; max gamma {MAX_GAMMA}; tokens/s on each "
          "profile's virtual clock:")
    for profile in PROFILES:
        print(f"- {profile.name}: {profile.label}")
    print()
    print("| profile | drafter | batch | gamma | sequences drafting | step width | "
          "tok/s per sequence | "
          "tok/s batch | plain batched | each drafting its alone gamma | reason |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for profile in PROFILES:
        for name, plan in PLANS.items():
            for r in replay(profile, plan, acceptance):
                gammas = (str(r.gammas[0]) if len(set(r.gammas)) == 1
                          else ",".join(map(str, r.gammas)))
                on = sum(g > 0 for g in r.gammas)
                # What earlier answers taught is the replay's premise: left out of the line.
                reason = r.reason.split("; earlier answers")[0]
                print(f"| {profile.name} | {name} | {r.sequences} | {gammas} | "
                      f"{on}/{r.sequences} | {r.width} | {r.per_sequence:.1f} | "
                      f"{r.aggregate:.1f} | {r.plain:.1f} | {r.as_alone:.1f} | {reason} |")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else TYPICAL_ACCEPTANCE)
