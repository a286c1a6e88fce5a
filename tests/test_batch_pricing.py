"""The adaptive controller prices a round in a batch at the step's total width (issue 46,
engine/control/batch.py and costs.py): alone it decides exactly as before, in a batch gamma
shrinks as the step fills and drafting stops where it cannot pay, and the reason line says so."""
from __future__ import annotations

import numpy as np
import pytest

from engine.control.batch import ALONE, Batch
from engine.control.controller import AdaptiveController
from engine.control.costs import at_width, round_cost
from engine.control.policy import FixedGamma
from engine.errors import SettingsError
from engine.round_plan import CONTEXT, MODEL, RoundPlan
from engine.stats import RoundStats
from bench.fakes.costed import Profile
from tests.fakes.flat_costs import FLAT
from bench.research.batch_replay import steady

VERIFY = [100.0, 130.0, 130.0, 135.0, 150.0, 190.0, 210.0, 230.0, 260.0]
DRAFT = [10.0 * (1 + 0.3 * (w - 1)) for w in range(1, 10)]
M = RoundPlan(MODEL, "draft-model", behind=1)
COPY = RoundPlan(CONTEXT, "prompt-lookup", tokens=(1,) * 8, match=8)
# The worked example of engine/control/costs.py: flat to 4 rows, then half a token a row.
EXAMPLE = Profile("example", tuple(10.0 * (1.0 if w <= 4 else 1 + 0.5 * (w - 4))
                                   for w in range(1, 10)), (1.0,) * 9)


def trained(rounds: int = 40, **kw) -> AdaptiveController:
    """A controller after `rounds` scripted rounds: the draft model's drafts all accepted, then
    lookups of which the first token is kept every other round."""
    c = AdaptiveController(max_gamma=8, draft_ms=DRAFT, verify_ms=VERIFY,
                           model_name="draft-model", **kw)
    for i in range(rounds):
        plan = M if i < rounds // 2 else COPY
        d = c.next_gamma(plan)
        g = d.gamma
        accepted = g if plan is M else min(g, i % 2)
        c.update(d, RoundStats(index=i, gamma=g, drafted=g, accepted=accepted, kind="x",
                               committed=accepted + 1, draft_ms=10.0 * g if plan is M else 0.0,
                               verify_ms=VERIFY[g] * (1.0 + 0.01 * (i % 3)), source="x"))
    return c


@pytest.mark.parametrize("plan", [M, RoundPlan(MODEL, "draft-model", behind=6), COPY])
def test_alone_prices_and_decides_exactly_as_before(plan: RoundPlan) -> None:
    c = trained()
    costs = c.costs
    assert costs is not None
    p = c.predict(plan)
    # The cost of a round alone is the old formula (to rounding: the controller computes the
    # catch-up's share as a minimum, in fewer array operations).
    verify = costs.verify_costs(9)
    if plan.model_drafts:
        both = np.stack((p.expected, p.hopeful))
        share = costs.catch_up_ms(plan.behind) / c._rounds_ahead(both)
        old = round_cost(verify, np.arange(9.0), costs.draft_token, share)
        assert np.allclose(p.ms, old[0], rtol=1e-12) and np.allclose(p.hopeful_ms, old[1],
                                                                      rtol=1e-12)
    else:
        assert np.array_equal(p.ms, verify)
    assert np.array_equal(p.speeds, 1e3 * p.expected / p.ms)
    # ALONE, the default, and a batch of one are the same decision, to the bit.
    default, alone, one = c.next_gamma(plan), c.next_gamma(plan, ALONE), c.next_gamma(
        plan, Batch(1))
    assert default == alone == one
    assert "batch" not in default.reason


def test_the_worked_example_of_the_cost_model() -> None:
    c = steady(EXAMPLE, COPY, 0.8)
    assert c.next_gamma(COPY).gamma == 3
    two = c.next_gamma(COPY, Batch(2, other_width=2, other_tokens=1.8))
    assert two.gamma == 1
    assert two.speeds[:4] == pytest.approx([280.0, 360.0, 282.67, 237.6], abs=0.01)
    # The step's width with this sequence's row and its drafted one.
    assert two.reason.startswith("batch of 2 at width 4, speedups the batch's: gamma 1: ")
    # Its own tokens/s: 1.8 tokens in a step of 10 ms.
    assert two.prediction == pytest.approx(180.0, abs=0.01)
    four = c.next_gamma(COPY, Batch(4, other_width=6, other_tokens=5.4))
    assert four.gamma == 0
    assert four.reason.startswith("plain: batch of 4: drafting cannot pay at width 7; ")


def test_a_batch_slower_than_all_plain_is_not_drafted_into() -> None:
    """Beside a copy that drafts 3 and keeps none, drafting 1 beats this sequence's plain round
    (1.40 tokens a unit against 1.33), but the batch decoding plainly makes 2: plain."""
    c = steady(EXAMPLE, COPY, 0.8)
    d = c.next_gamma(COPY, Batch(2, other_width=4, other_tokens=1.0))
    assert d.speeds[:2] == pytest.approx([133.33, 140.0], abs=0.01)
    assert d.gamma == 0
    assert d.reason.startswith("plain: batch of 2: drafting cannot pay at width 5; best "
                               "predicted 0.70x at gamma 1")


def test_the_others_draft_decodes_are_in_the_step() -> None:
    c = steady(FLAT, M, 0.8)
    costs = c.costs
    assert costs is not None
    db, pace = costs.draft_batch, costs.draft_token / costs.draft_batch[0]
    # Depth 1 decodes three drafts, depths 2 and 3 two, depth 4 one.
    assert costs.others_draft_ms(Batch(4, 11, other_drafts=(4, 3, 1))) == pytest.approx(
        pace * (at_width(db, 3) + 2 * at_width(db, 2) + at_width(db, 1)))
    assert costs.others_draft_ms(Batch(4, 3)) == 0.0


def test_gamma_shrinks_as_the_batch_fills_and_stops_where_it_cannot_pay() -> None:
    c = steady(Profile("cpu-like", tuple(VERIFY), tuple(DRAFT)), M, 0.7)
    gammas = []
    for n in (1, 2, 4, 8, 16):
        # Every other sequence drafts 4 through the draft model and commits 3 tokens.
        d = c.next_gamma(M, Batch(n, 5 * (n - 1), 3.0 * (n - 1), (4,) * (n - 1)))
        gammas.append(d.gamma)
    assert gammas == [3, 1, 0, 0, 0]
    assert d.reason.startswith("plain: batch of 16: drafting cannot pay at width 76; ")


def test_a_draft_depth_others_share_costs_less_than_one_drawn_alone() -> None:
    c = steady(FLAT, M, 0.8)
    costs = c.costs
    assert costs is not None
    shared = costs.step_ms(8, True, Batch(2, 7, 1.0, (6,)))
    lone = costs.step_ms(8, True, Batch(2, 7, 1.0, ()))
    # Depths 1..6 join the other's draft batch; 7 and 8 are decoded for this sequence alone.
    assert shared[6] - shared[0] < lone[6] - lone[0]
    assert shared[8] - shared[6] == pytest.approx(lone[8] - lone[6])


def test_no_probe_in_a_batch() -> None:
    # A dear draft at a pessimistic prior: plain wins, and alone a probe is in the budget.
    c = AdaptiveController(max_gamma=8, draft_ms=[45.0] * 9, verify_ms=VERIFY,
                           model_name="draft-model", prior=0.5, explore_share=1.0, opening=())
    c.evidence.plain_ms = 1e6
    assert c.next_gamma(M).probing
    d = c.next_gamma(M, Batch(2, 1))
    assert not d.probing and d.gamma == 0


def test_every_policy_keeps_the_batch_it_decided_in() -> None:
    batch = Batch(3, 4, other_drafts=(2,))
    assert FixedGamma(3).next_gamma(M, batch).batch == batch
    assert trained().next_gamma(M, batch).batch == batch


@pytest.mark.parametrize("kw", [dict(sequences=0), dict(sequences=3, other_width=1),
                                dict(sequences=2, other_width=3, other_drafts=(2, 2)),
                                dict(sequences=2, other_width=3, other_drafts=(0,)),
                                dict(sequences=3, other_width=4, other_tokens=1.0)])
def test_a_batch_that_cannot_be_is_refused(kw: dict) -> None:
    with pytest.raises(SettingsError):
        Batch(**kw)


def test_a_round_in_a_batch_teaches_the_steps_width_and_not_the_drafts_cost() -> None:
    c = steady(FLAT, M, 0.8)
    costs = c.costs
    assert costs is not None
    # Three others drafting 3, each expected to commit 3.
    batch = Batch(4, 12, 9.0, other_drafts=(3, 3, 3))
    d = c.next_gamma(M, batch)
    assert d.gamma > 0
    before, draft = list(costs.verify), costs.draft_token
    width = d.gamma + 1 + 12
    c.update(d, RoundStats(index=5, gamma=d.gamma, drafted=d.gamma, accepted=d.gamma, kind="x",
                           committed=d.gamma + 1, draft_ms=50.0 * d.gamma,
                           verify_ms=2 * costs.verify_cost(width), width=d.gamma + 1))
    # The step's width moved fully towards the step's time, the draft's cost not at all.
    assert costs.verify[width - 1] == pytest.approx(at_width(before, width) * (1 + costs.rate))
    assert costs.draft_token == draft
