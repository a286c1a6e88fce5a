"""The adaptive controller's decisions on scripted costs and acceptance, its calibration, the
heuristic policy, policy selection by name, and the CLI's speculation options."""
from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest

from engine.control.controller import AdaptiveController, Calibration, calibrate
from engine.control.evidence import Evidence
from engine.control.estimator import Counts
from engine.drafters.draft_model import DraftModelDrafter
from engine.round_plan import CONTEXT, HISTORY, MODEL, NO_PLAN, RoundPlan
from engine.errors import SettingsError
from engine.events import DoneEvent
from engine.generator import generate
from engine.generation_config import COPY_MAX, GenerationConfig
from engine.control.registry import make_policy
from engine.control.policy import Decision, FixedGamma, GammaPolicy, HeuristicGamma
from engine.sampling import SamplingParams
from engine.session import Session
from engine.stats import RoundStats
from bench.fakes.backend import FakeBackend

# Target verify cost by width 1..9 (ms), shaped like the measured 1.5B curve on this CPU.
VERIFY = [100.0, 130.0, 130.0, 135.0, 150.0, 190.0, 210.0, 230.0, 260.0]
PROMPT = [3, 14, 15, 9, 26]
# Rounds the draft model would draft, in step with the text (or `behind` tokens behind it), and
# one prompt lookup would copy.
M = RoundPlan(MODEL, "draft-model", behind=1)
COPY = RoundPlan(CONTEXT, "prompt-lookup", tokens=(1, 2, 3, 4, 5, 6, 7, 8), match=3)


def model(behind: int) -> RoundPlan:
    return RoundPlan(MODEL, "draft-model", behind=behind)


def draft_table(per_token: float) -> list[float]:
    return [per_token * (1 + 0.3 * (w - 1)) for w in range(1, 10)]


def controller(per_token: float = 10.0, **kw) -> AdaptiveController:
    return AdaptiveController(max_gamma=8, draft_ms=draft_table(per_token), verify_ms=VERIFY,
                              model_name="draft-model", **kw)


def play(c: AdaptiveController, rounds: int, accept_all: bool, source: str = "draft-model",
         draft_per_token: float = 10.0, verify_scale: float = 1.0) -> list[int]:
    """Feed the controller rounds whose outcome is scripted; return the gammas it chose."""
    chosen = []
    for i in range(rounds):
        d = c.next_gamma(M)
        g = d.gamma
        chosen.append(g)
        accepted = g if accept_all else 0
        c.update(d, RoundStats(index=i, gamma=g, drafted=g, accepted=accepted, kind="x",
                            committed=accepted + 1, draft_ms=draft_per_token * g,
                            verify_ms=VERIFY[g] * verify_scale, source=source if g else "plain"))
    return chosen


def test_high_acceptance_and_a_cheap_draft_give_a_large_gamma():
    c = controller()
    gammas = play(c, 30, accept_all=True)
    assert gammas[-1] >= 6
    assert c.acceptance(M)[0] > 0.9


def test_low_acceptance_falls_back_to_plain_decoding():
    c = controller(explore_share=0.0)
    gammas = play(c, 10, accept_all=False)
    # Every round loses, so the controller soon stays plain.
    assert gammas[-5:] == [0] * 5
    assert c.predicted_tps(0, M) == pytest.approx(1e3 / c.costs.verify[0])


def test_an_expensive_draft_is_never_used_even_when_it_would_be_accepted():
    c = controller(per_token=90.0)
    assert play(c, 5, accept_all=True, draft_per_token=90.0) == [0] * 5


def test_it_explores_where_the_prior_alone_predicts_a_loss_once_its_budget_allows():
    # At the prior acceptance this draft loses to plain decoding, so only data can say otherwise.
    c = controller(per_token=45.0, prior=0.5)
    assert c.best_gamma(M) == 0 and c.could_pay(M, c.predict(M).ms)
    gammas = play(c, 200, accept_all=True, draft_per_token=45.0)
    # An exploring round of 2 loses at most 130 + 2 * 45 - 100 = 120 ms against a plain token
    # (100 ms): 1% of plain time pays for it after 120 plain rounds, not before.
    first = next(i for i, g in enumerate(gammas) if g > 0)
    assert 100 <= first <= 125 and gammas[first] == 2
    # It was accepted: the draft pays, and drafting goes on.
    assert gammas[-1] > 0 and gammas[-10:].count(0) == 0


def test_exploration_stops_where_drafting_loses():
    c = controller()
    gammas = play(c, 3000, accept_all=False)
    explored = [i for i, g in enumerate(gammas) if g > 0 and i > 10]
    # The posterior closes: a handful of exploring rounds, none in the second half.
    assert 1 <= len(explored) <= 12 and max(explored) < 1500
    assert not c.could_pay(M, c.predict(M).ms)


def test_exploration_stays_within_one_percent_of_plain_time_over_a_long_run():
    """Every source and match length explores from one budget: what exploring rounds lost
    against plain decoding stays within 1% of the plain time of what was committed."""
    rng = np.random.default_rng(0)
    c = controller(per_token=30.0, opening=())
    plans = [M] + [RoundPlan(CONTEXT, "prompt-lookup", tokens=(1,) * 8, match=m)
                   for m in (1, 2, 3, 5, 9, 20)] + [
        RoundPlan("history", "suffix", tokens=(1,) * 8, match=m) for m in (4, 10, 30)]
    for i in range(20000):
        plan = plans[int(rng.integers(len(plans)))]
        d = c.next_gamma(plan)
        g = d.gamma
        # Drafts rarely survive (each position 0.15): every source loses on this verify curve.
        survives = np.append(rng.random(g) < 0.15, False)
        accepted = int(np.argmin(survives))
        draft = 30.0 * g if plan.model_drafts else 0.0
        c.update(d, RoundStats(index=i, gamma=g, drafted=g, accepted=accepted, kind="x",
                               committed=accepted + 1, draft_ms=draft, verify_ms=VERIFY[g]))
    ev = c.evidence
    assert ev.explored_ms > 0
    assert ev.explored_ms <= 0.01 * ev.plain_ms


def test_a_new_answer_starts_from_what_earlier_answers_learned():
    """A controller handed the drafter's evidence with its calibration knows what an earlier
    one learned, and its reason line says so."""
    cal = Calibration(draft_table(10.0), list(VERIFY), "draft-model")
    evidence = Evidence()
    first = AdaptiveController(max_gamma=8, opening=())
    first.use_calibration(cal, evidence)
    copy = RoundPlan(CONTEXT, "prompt-lookup", tokens=(1,) * 8, match=2)
    for i in range(40):
        d = first.next_gamma(copy)
        first.update(d, RoundStats(index=i, gamma=max(d.gamma, 1), drafted=max(d.gamma, 1),
                                   accepted=0, kind="correction", committed=1, draft_ms=0.0,
                                   verify_ms=VERIFY[max(d.gamma, 1)]))
    fresh = AdaptiveController(max_gamma=8, opening=(), model_name="draft-model",
                               draft_ms=draft_table(10.0), verify_ms=VERIFY)
    second = AdaptiveController(max_gamma=8, opening=())
    second.use_calibration(cal, evidence)
    assert fresh.next_gamma(copy).gamma > 0
    d = second.next_gamma(copy)
    assert d.gamma == 0
    assert "earlier answers: lookup at 2-token matches: 0.00 accepted over 40 rounds" in d.reason
    assert second.evidence is evidence and evidence.answers == 2


def plain(c: AdaptiveController, rounds: int, confidence: float) -> list[int]:
    """Plain rounds (gamma 0, no probing allowed to draft) that report the target's confidence."""
    chosen = []
    for i in range(rounds):
        d = c.next_gamma(M)
        chosen.append(d.gamma)
        c.update(d, RoundStats(index=i, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                            draft_ms=0.0, verify_ms=VERIFY[0], source="plain",
                            confidence=(confidence,)))
    return chosen


def test_a_confident_target_brings_speculation_back_without_a_probe():
    c = controller(explore_share=0.0)
    play(c, 12, accept_all=False)
    assert c.best_gamma(M) == 0
    plain(c, 20, confidence=0.3)
    # The estimate follows the confidence (times a scale of 1: nothing drafted said otherwise).
    assert c.best_gamma(M) == 0 and c.acceptance(M)[0] == pytest.approx(0.3, abs=0.05)
    gammas = plain(c, 20, confidence=0.99)
    # Each plain round is a fraction of an observation: a few rounds, not the first one.
    resumed = gammas.index(next(g for g in gammas if g > 0))
    assert 1 <= resumed <= 10 and not c.next_gamma(M).probing


def test_confidence_per_acceptance_is_learned_from_the_rounds_that_drafted():
    c = controller()
    assert c.estimator.scale == pytest.approx(1.0)
    for i in range(10):
        # The draft is right every time although the target is only half sure: scale rises.
        c.update(Decision(2, M), RoundStats(index=i, gamma=2, drafted=2, accepted=2, kind="bonus", committed=3,
                            draft_ms=20.0, verify_ms=VERIFY[2], source="draft-model",
                            confidence=(0.5, 0.5, 0.5)))
    assert c.estimator.scale > 1.4
    high = c.estimator.scale
    for i in range(10):
        # Rejected at the first position although the target was sure: scale falls. The row
        # after a rejection was not tested and does not count.
        c.update(Decision(2, M), RoundStats(index=i, gamma=2, drafted=2, accepted=0, kind="correction",
                            committed=1, draft_ms=20.0, verify_ms=VERIFY[2], source="draft-model",
                            confidence=(0.95, 0.0, 0.0)))
    assert c.estimator.scale < min(high, 1.0)


def test_only_policies_that_ask_get_the_targets_confidence():
    class Recording(FixedGamma):
        def __init__(self, gamma, asks):
            super().__init__(gamma)
            self.wants_confidence, self.rounds = asks, []

        def update(self, decision, r):
            self.rounds.append(r)

    seen = {}
    for asks in (False, True):
        policy = Recording(3, asks)
        # A noisy draft, so that some rounds stop at a rejection.
        drafter = DraftModelDrafter(FakeBackend(noise=3.0))
        config = GenerationConfig(params=SamplingParams(seed=1), gamma=3, max_tokens=32)
        list(generate(Session(FakeBackend()), drafter, PROMPT, config, policy))
        seen[asks] = policy.rounds
    assert all(r.confidence == () for r in seen[False])
    # Up to the committed token: the accepted positions and the correction or bonus row.
    assert all(len(r.confidence) == r.accepted + 1 for r in seen[True])
    assert any(r.accepted < r.drafted for r in seen[True])
    assert all(0.0 < x <= 1.0 for r in seen[True] for x in r.confidence)
    assert controller().wants_confidence


def test_online_refinement_moves_the_cost_estimates():
    c = controller()
    before_v1, before_v5, before_d = c.costs.verify[0], c.costs.verify[4], c.costs.draft_token
    for i in range(20):
        c.update(Decision(4, M), RoundStats(index=i + 1, gamma=4, drafted=4, accepted=4, kind="bonus",
                            committed=5, draft_ms=4 * 30.0, verify_ms=2 * VERIFY[4],
                            source="draft-model"))
    assert c.costs.verify[4] == pytest.approx(2 * before_v5, rel=0.05)
    assert before_v1 < c.costs.verify[0] < 2 * before_v1
    assert c.costs.draft_token == pytest.approx(30.0, rel=0.05) and before_d == 10.0


def test_a_uniform_slowdown_leaves_the_choice_of_gamma_as_calibrated():
    def run(scale: float) -> AdaptiveController:
        c = controller(per_token=25.0)
        play(c, 6, accept_all=True)
        n = c.rounds
        for i in range(12):
            c.update(Decision(0, M), RoundStats(index=n + i, gamma=0, drafted=0, accepted=0, kind="target",
                                committed=1, draft_ms=0.0, verify_ms=VERIFY[0] * scale,
                                source="plain"))
        return c

    same, slow = run(1.0), run(1.15)
    assert slow.costs.verify[0] == pytest.approx(1.15 * same.costs.verify[0], rel=0.02)
    # Every cost moved by the same factor: the predicted gain of each gamma is unchanged.
    gain = lambda c: np.array(c.next_gamma(M).speeds) / c.next_gamma(M).speeds[0]  # noqa: E731
    assert np.allclose(gain(slow), gain(same), rtol=0.02)
    assert slow.best_gamma(M) == same.best_gamma(M) > 0


def test_the_first_round_after_the_prefill_does_not_teach_costs():
    c = controller()
    before = list(c.costs.verify)
    c.update(Decision(0, M), RoundStats(index=0, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                        draft_ms=0.0, verify_ms=3 * VERIFY[0], source="plain"))
    assert list(c.costs.verify) == before
    c.update(Decision(0, M), RoundStats(index=1, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                        draft_ms=0.0, verify_ms=3 * VERIFY[0], source="plain"))
    assert c.costs.verify[0] > before[0]


def test_the_plain_control_policy_runs_the_speculative_path_without_drafting():
    drafter = DraftModelDrafter(FakeBackend(noise=0.5))
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=24)
    plain = [e for e in generate(Session(FakeBackend()), drafter, PROMPT, config,
                                 make_policy("plain", 4)) if isinstance(e, DoneEvent)][0]
    base = [e for e in generate(Session(FakeBackend()), None, PROMPT, config)
            if isinstance(e, DoneEvent)][0]
    assert plain.stats.mode == "speculative" and plain.stats.drafted_tokens == 0
    assert plain.tokens == base.tokens and plain.stats.gammas == [0] * plain.stats.rounds


def test_acceptance_follows_the_text_with_decay():
    c = controller()
    play(c, 20, accept_all=True)
    high = c.acceptance(M)[0]
    play(c, 3, accept_all=False)
    assert c.acceptance(M)[0] < high - 0.15


def test_acceptance_positions_after_a_rejection_are_not_counted():
    c = controller()
    c.update(Decision(4, M), RoundStats(index=0, gamma=4, drafted=4, accepted=1, kind="correction", committed=2,
                        draft_ms=40.0, verify_ms=135.0, source="draft-model"))
    assert c.estimator.model.tries.tolist()[:4] == [1.0, 1.0, 0.0, 0.0]
    assert c.estimator.model.hits.tolist()[:4] == [1.0, 0.0, 0.0, 0.0]


def test_the_drafts_lag_is_costed_as_the_drafter_reports_it():
    c = controller()
    cost = c.cost_ms(3, model(1))
    # Six tokens to feed before drafting (five plain rounds): resuming pays the catch-up once,
    # then speculates on, so early in an answer it is spread over `horizon` rounds.
    assert c.next_gamma(model(6)).plan.behind == 6
    assert c.cost_ms(3, model(6)) == pytest.approx(
        cost + (c.costs.draft_batch[5] - c.costs.draft_batch[0]) / c.constants.horizon)
    # A copy pays none of it.
    assert c.cost_ms(3, COPY) == c.costs.verify_cost(4)
    # Asking is not deciding: the answers do not depend on what was asked before.
    assert c.cost_ms(3, model(1)) == cost


def test_the_drafter_says_how_far_behind_it_is():
    """A model's plan says what it must decode before drafting (its session's sync), and
    hybrid's model is not prefilled, so its first round catches up on the whole prompt."""
    from engine.drafters.hybrid import HybridDrafter
    from engine.drafters.prompt_lookup import PromptLookupDrafter
    params = SamplingParams(temperature=0.0)
    model = DraftModelDrafter(FakeBackend(noise=0.3))
    text = PROMPT + [7, 8]
    assert model.plan(text, params).behind == len(text)
    model.prefill(PROMPT)
    assert model.plan(PROMPT, params).behind == 1 and model.plan(text, params).behind == 3
    hybrid = HybridDrafter(PromptLookupDrafter(), DraftModelDrafter(FakeBackend(noise=0.3)))
    hybrid.prefill(PROMPT)
    assert hybrid.plan(PROMPT, params).behind == len(PROMPT)
    assert PromptLookupDrafter().plan(PROMPT + PROMPT[:2], params).behind == 0


def test_late_in_a_long_answer_the_catch_up_is_spread_over_the_rounds_it_would_fill():
    c = controller()
    for i in range(80):
        c.update(Decision(0, M), RoundStats(index=i, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                            draft_ms=0.0, verify_ms=100.0, source="plain"))
    assert c.elapsed == 80 and c.next_gamma(model(81)).plan.behind == 81
    rounds = 80 / c.predict(model(81)).expected[3]
    assert rounds > c.constants.horizon
    catch_up = c.costs.catch_up_ms(81)
    assert c.cost_ms(3, model(81)) == pytest.approx(
        c.costs.verify_cost(4) + 3 * c.costs.draft_token + catch_up / rounds)
    # Without the length rule, the fixed horizon prices it dearer per round.
    fixed = controller(horizon_cap=0.0)
    fixed.elapsed, fixed.evidence.costs = c.elapsed, c.costs
    assert fixed.cost_ms(3, model(81)) == pytest.approx(
        c.costs.verify_cost(4) + 3 * c.costs.draft_token + catch_up / c.constants.horizon)


def test_keep_drafting_draws_the_next_token_only_when_a_longer_round_is_worth_it():
    # VERIFY: one token 100 ms, 2 -> 130, 3 -> 130, 4 -> 135; the draft 10 ms a token.
    c = controller()
    # 0.99 expected tokens for 0.3 of verify.
    assert c.keep_drafting([], 0.99, 3, False)
    # 0.2 for 0.3, and longer rounds (another draft decode each) are no better: none.
    assert not c.keep_drafting([], 0.2, 3, False)
    # A doubtful third token after two sure ones: 0.045 expected for 0.05 of verify.
    assert not c.keep_drafting([0.95, 0.95], 0.05, 3, False)
    # Width 3 costs the same as width 2 here, so a doubtful second token rides along free.
    assert c.keep_drafting([0.9], 0.1, 2, False)
    # Only rounds within the limit count, and further tokens pay their draft decodes: 0.28
    # expected for 0.3 with one token; 0.36 for 0.3 with two when drafting costs nothing
    # more, for 0.4 when each further token costs a tenth of a target token.
    free = controller(per_token=0.0)
    assert not free.keep_drafting([], 0.28, 1, False) and free.keep_drafting([], 0.28, 2, False)
    assert not c.keep_drafting([], 0.28, 2, False)
    # The learned verify curve decides: when a 2-token batch costs two tokens, draft none.
    c.costs.verify = [100.0, 200.0, 300.0, 400.0]
    assert not c.keep_drafting([], 0.9, 3, False)


def test_keep_drafting_knows_a_sampled_rounds_verify_width_is_paid_once_it_drafts():
    c = controller()
    # The round verifies 4 wide once anything is drawn: the third token rides along free...
    assert c.keep_drafting([0.95, 0.95], 0.05, 3, True)
    # ...but the first must pay for the whole width (0.35 of a target token), not for 2.
    assert not c.keep_drafting([], 0.32, 3, True) and c.keep_drafting([], 0.32, 3, False)
    assert c.keep_drafting([], 0.99, 3, True)


def test_rounds_teach_the_draft_cost_per_drafted_token_less_the_catch_up():
    c = controller(per_token=10.0)
    c.costs.draft_token = 10.0
    # Two tokens drafted at 20 ms each, one accepted.
    c.update(c.next_gamma(M), RoundStats(index=0, gamma=3, drafted=2, accepted=1, kind="correction",
                        committed=2, draft_ms=40.0, verify_ms=130.0, source="draft-model"))
    assert c.costs.draft_token == pytest.approx(10.0 + c.constants.rate * (20.0 - 10.0))
    # After a catch-up of 6 tokens the round's time less the catch-up is what drafting cost.
    c.costs.draft_token = 10.0
    c.update(Decision(3, model(6)), RoundStats(index=1, gamma=3, drafted=2, accepted=1, kind="correction",
                        committed=2, draft_ms=40.0 + c.costs.catch_up_ms(6), verify_ms=130.0,
                        source="draft-model"))
    assert c.costs.draft_token == pytest.approx(10.0 + c.constants.rate * (20.0 - 10.0))


class Cutting(FixedGamma):
    """Fixed gamma 4 whose keep hook records what it is shown and stops under 0.6."""

    def __init__(self):
        super().__init__(4)
        self.seen = []

    def keep_drafting(self, own, sure, limit, fixed_width):
        self.seen.append((list(own), sure))
        return sure >= 0.6


def test_the_generator_hands_the_policys_stopping_rule_to_the_drafter():
    greedy = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=40)
    plain = list(generate(Session(FakeBackend()), None, PROMPT, replace(greedy, gamma=0)))[-1]
    policy = Cutting()
    done = list(generate(Session(FakeBackend()), DraftModelDrafter(FakeBackend(scale=1.0)),
                         PROMPT, greedy, policy))[-1]
    assert done.tokens == plain.tokens
    # Greedy: `sure` is the draft's untempered top probability; the hook cut rounds short.
    assert any(sure < 0.6 for _, sure in policy.seen)
    assert all(len(own) < 4 for own, _ in policy.seen)
    s = done.stats
    assert s.drafted_tokens < sum(s.gammas)
    # Sampling: `own` holds q(x) of the tokens already drawn, `sure` the next row's max of q.
    policy = Cutting()
    done = list(generate(Session(FakeBackend()), DraftModelDrafter(FakeBackend(scale=1.0)),
                         PROMPT, GenerationConfig(params=SamplingParams(temperature=1.0, seed=1),
                                                  gamma=4, max_tokens=40), policy))[-1]
    assert done.stats.drafted_tokens < sum(done.stats.gammas)
    assert all(0 < sure <= 1 for _, sure in policy.seen)


def test_the_draft_model_catches_up_in_one_batch_after_plain_rounds():
    class Scripted(GammaPolicy):
        name = "scripted"

        def __init__(self, gammas):
            self.gammas = list(gammas)
            self.i = 0

        def next_gamma(self, plan=None, batch=None):
            self.i += 1
            return Decision(self.gammas[(self.i - 1) % len(self.gammas)])

        def update(self, decision, r):
            pass

    draft = FakeBackend(noise=0.3)
    drafter = DraftModelDrafter(draft)
    target = Session(FakeBackend())
    config = GenerationConfig(params=SamplingParams(), gamma=4, max_tokens=30)
    events = list(generate(target, drafter, PROMPT, config, Scripted([2, 0, 0, 0, 0, 2])))
    assert isinstance(events[-1], DoneEvent)
    # Widths of the draft's decodes: after four plain rounds its first decode swallows >= 5.
    widths = [n for _, n in draft.calls]
    assert max(widths[1:]) >= 5
    assert draft.cache == drafter.session.tokens


def test_calibration_times_every_width_and_leaves_the_caches_as_they_were():
    target = Session(FakeBackend())
    draft = Session(FakeBackend(noise=0.3))
    target.extend([1, 2, 3])
    cal = calibrate(target, draft, max_gamma=5, context=[7, 8, 9], reps=1,
                    model_name="draft-model")
    assert len(cal.verify_ms) == len(cal.draft_ms) == 6
    assert min(cal.verify_ms) > 0 and min(cal.draft_ms) > 0
    assert target.tokens == [1, 2, 3] == target.backend.cache
    assert draft.tokens == [] == draft.backend.cache
    # Verification widths were decoded with every row, as a real round does.
    assert (3, 6) in target.backend.calls
    lookup = calibrate(target, None, 2, [7, 8])
    assert lookup.draft_ms == (0.0, 0.0, 0.0) and lookup.model_name is None


def test_generator_records_the_prediction_and_the_measured_speed_per_round():
    target = Session(FakeBackend())
    drafter = DraftModelDrafter(FakeBackend(noise=0.5))
    cal = calibrate(target, drafter.session, 4, PROMPT, reps=1, model_name=drafter.name)
    policy = make_policy("adaptive", 4, **cal.as_kwargs())
    config = GenerationConfig(params=SamplingParams(), gamma=4, max_tokens=24)
    done = list(generate(target, drafter, PROMPT, config, policy))[-1]
    s = done.stats
    assert len(s.predicted_tps) == len(s.measured_tps) == len(s.gammas) == s.rounds
    assert all(p is not None and p > 0 for p in s.predicted_tps)
    assert all(m > 0 for m in s.measured_tps)
    assert "predicted_tps" in s.as_dict()


def test_uncalibrated_controller_refuses_to_choose():
    with pytest.raises(SettingsError, match="no calibration"):
        AdaptiveController(max_gamma=4).next_gamma(M)
    with pytest.raises(SettingsError):
        AdaptiveController(max_gamma=4).use_calibration(Calibration([1.0], [0.0]), Evidence())
    with pytest.raises(SettingsError):
        AdaptiveController(max_gamma=0)


def test_heuristic_policy_adds_two_on_full_acceptance_and_drops_one_otherwise():
    h = HeuristicGamma(4)
    seen = []
    for accepted_all in [True, True, False, False, False, False, False, False, True]:
        g = h.next_gamma().gamma
        seen.append(g)
        h.update(h.next_gamma(), RoundStats(index=0, gamma=g, drafted=g, accepted=g if accepted_all else 0,
                            kind="x", committed=1, draft_ms=1.0, verify_ms=1.0))
    assert seen == [4, 6, 8, 7, 6, 5, 4, 3, 2]
    assert h.next_gamma().gamma == 4
    for _ in range(10):
        h.update(h.next_gamma(), RoundStats(index=0, gamma=1, drafted=1, accepted=0, kind="x", committed=1,
                            draft_ms=1.0, verify_ms=1.0))
    assert h.next_gamma().gamma == 1
    h.update(h.next_gamma(), RoundStats(index=0, gamma=1, drafted=0, accepted=0, kind="x", committed=1,
                        draft_ms=0.0, verify_ms=1.0))
    assert h.next_gamma().gamma == 1


def test_policies_by_name():
    assert make_policy("fixed", 3).name == "fixed-3"
    assert make_policy("heuristic", 3).name == "heuristic"
    adaptive = make_policy("adaptive", 6)
    # Uncalibrated: it asks the pair to measure the widest round, a copy's (COPY_MAX tokens).
    assert adaptive.name == "adaptive" and adaptive.calibration_need() == COPY_MAX
    with pytest.raises(SettingsError, match="unknown policy"):
        make_policy("greedy", 3)


def parse(*argv: str) -> argparse.Namespace:
    from app.cli import build_parser
    return build_parser().parse_args(["generate", "--prompt", "x", "--target", "t.gguf",
                                      "--draft", "d.gguf", *argv])


def test_cli_speculation_options():
    from app.settings import draft_stops, model_configs, request_spec
    args = parse()
    spec = request_spec(args)
    assert (spec.drafter, spec.policy, spec.gamma) == ("hybrid", "adaptive", 8)
    assert model_configs(args, args.drafter)[1] is not None
    args = parse("--drafter", "lookup", "--policy", "fixed", "--lookup-ngram", "4")
    assert request_spec(args).gamma == 4 and args.lookup_ngram == 4
    assert model_configs(args, args.drafter)[1] is None
    args = parse("--drafter", "early-exit", "--draft-p-min", "0.2", "--early-exit-layers", "9")
    assert args.early_exit_layers == 9 and args.draft_p_min == 0.2
    assert draft_stops(args) == {"p_min": 0.2, "chain_min": 0.5}
    assert draft_stops(parse("--draft-chain-min", "0"))["chain_min"] == 0.0
    assert model_configs(args, args.drafter)[1] is None
    assert request_spec(parse("--draft", "none")).drafter == "plain"
    # Plain decoding's old name still chooses it.
    assert request_spec(parse("--drafter", "none")).drafter == "plain"
    with pytest.raises(SettingsError, match="needs a draft model"):
        model_configs(parse("--draft", "none", "--drafter", "hybrid"), "hybrid")


def test_the_plain_opening_is_a_setting():
    c = make_policy("adaptive", 8, opening=6, draft_ms=draft_table(10.0), verify_ms=VERIFY,
                    model_name="draft-model")
    gammas = play(c, 10, accept_all=True)
    assert gammas[:6] == [0] * 6 and gammas[6] > 0
    assert make_policy("adaptive", 8).opening_plain == 0
    with pytest.raises(SettingsError, match="opening"):
        make_policy("adaptive", 8, opening=-1)


def test_every_choice_comes_with_a_one_line_reason():
    c = controller(opening_plain=1)
    d = c.next_gamma(M)
    assert d.gamma == 0 and d.reason.startswith("plain: opening round 1 of 1")
    c.update(d, RoundStats(index=0, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                        draft_ms=0.0, verify_ms=100.0, source="plain"))
    d = c.next_gamma(M)
    g, speeds = d.gamma, d.speeds
    assert d.prediction == speeds[g]
    if g:
        assert d.reason.startswith(f"gamma {g}: predicted {speeds[g] / speeds[0]:.2f}x") \
            or d.reason.startswith(f"explore: gamma {g}")
    # A draft as dear as the target: plain, and the line says what it costs and that no gamma
    # pays; one a third as dear that does not pay either says what the best gamma would give.
    dear = controller(per_token=100.0, opening=(), explore_share=0.0)
    dear.estimator.model.tries[:] = 1.0
    d = dear.next_gamma(M)
    assert d.gamma == 0 and not d.speeds
    assert d.reason == ("plain: the draft costs 1.00 of a target token; no gamma pays at up to "
                        "0.09 accepted a token")
    cheaper = controller(per_token=10.0, opening=(), explore_share=0.0)
    cheaper.estimator.model.tries[:] = 1.0
    cheaper.estimator.model.hits[0] = 1.0
    d = cheaper.next_gamma(M)
    assert d.gamma == 0 and d.speeds
    assert d.reason.startswith("plain: the draft costs 0.10 of a target token; best "
                               "predicted 1.07x at gamma 1")
    assert FixedGamma(3).next_gamma().reason == "fixed: gamma 3 every round"
    assert make_policy("plain", 1).next_gamma().reason.startswith("plain")


def test_the_reason_reaches_the_generation_stats():
    done = list(generate(Session(FakeBackend()), DraftModelDrafter(FakeBackend(noise=0.3)),
                         PROMPT, GenerationConfig(params=SamplingParams(), gamma=2,
                                                  max_tokens=6), FixedGamma(2)))[-1]
    assert done.stats.reason == "fixed: gamma 2 every round"
    assert done.stats.as_dict()["reason"] == done.stats.reason


def test_a_copy_from_the_context_is_priced_by_its_verify_alone():
    """Hybrid drafting (issue 17's first item): prompt lookup costs no draft decode and no
    catch-up, so it may speculate where the draft model, as dear as the target, may not."""
    c = AdaptiveController(max_gamma=8, draft_ms=draft_table(100.0), verify_ms=VERIFY,
                           model_name="draft-model", opening=(), explore_share=0.0)
    c.estimator.model.tries[:] = 1.0
    c.estimator.model.hits[:] = 0.7
    assert c.next_gamma(M).gamma == 0
    d = c.next_gamma(COPY)
    g = d.gamma
    assert g > 0 and d.plan.is_copy
    assert c.cost_ms(g, COPY) == c.costs.verify_cost(g + 1)
    assert "copying from the context" in d.reason
    # A copy round teaches the copy's acceptance, not the model's, and no draft cost.
    before = (c.costs.draft_token, c.estimator.model.tries.copy())
    c.update(d, RoundStats(index=1, gamma=g, drafted=g, accepted=0, kind="correction",
                        committed=1, draft_ms=0.1, verify_ms=130.0, source="prompt-lookup"))
    assert c.costs.draft_token == before[0] and np.array_equal(c.estimator.model.tries, before[1])
    copies = c.estimator.counts(COPY.acceptance_key)
    assert copies.tries[0] > 0 and copies.hits[0] == 0
    # A plain round where only a copy was on offer ages the copy's evidence, so it is tried
    # again before long.
    tries = copies.tries.copy()
    c.update(Decision(0, COPY), RoundStats(index=2, gamma=0, drafted=0, accepted=0, kind="target",
                        committed=1, draft_ms=0.0, verify_ms=100.0, source="plain"))
    assert np.allclose(copies.tries, tries * c.constants.decay)


def test_hybrid_speculates_with_lookup_where_the_draft_model_is_too_dear():
    from engine.pair import Pair
    from bench.fakes.table import TableFake, VirtualClock
    clock = VirtualClock()
    dear = [30.0 + 3.0 * w for w in range(10)]
    pair = Pair(TableFake(seed=3, clock=clock, cost=[30.0 + 3.0 * w for w in range(10)]),
                TableFake(seed=3, noise=0.5, clock=clock, cost=dear), clock=clock.now)
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8, max_tokens=40)
    rounds = [ev.round for ev in pair.generate("abcdefg" * 6, config, raw=True)
              if type(ev).__name__ == "RoundEvent"]
    assert all(r.is_copy for r in rounds if r.drafted)
    assert sum(r.drafted for r in rounds) > 0


def test_the_model_after_a_copy_needs_the_resumption_margin():
    """Carrying on needs a smaller predicted saving than starting again; a copy round does not
    count as the model carrying on (its estimate and its catch-up were not just tested)."""
    from engine.stats import RoundStats
    c = AdaptiveController(max_gamma=8, draft_ms=draft_table(20.0), verify_ms=VERIFY,
                           opening=(), explore_share=0.0)
    c.estimator.model.tries[:] = 3.0
    c.estimator.model.hits[:] = 3.0 * 0.55

    def after(decision: Decision) -> int:
        c.update(decision, RoundStats(index=1, gamma=decision.gamma, drafted=2, accepted=1,
                                      kind="correction", committed=2, draft_ms=0.0,
                                      verify_ms=130.0, source=decision.plan.drafter or "m"))
        c.estimator.model.tries[:] = 3.0
        c.estimator.model.hits[:] = 3.0 * 0.55
        return c.best_gamma(M)

    assert after(Decision(2, RoundPlan("history", "suffix", tokens=(1, 2), match=5))) == 0
    assert after(Decision(2, M)) == 2


class _Predicting(AdaptiveController):
    """The controller with every round's prediction made in full."""

    def _loses(self, plan: RoundPlan) -> float | None:
        return None


class _SkippingOnTheProbeAlone(AdaptiveController):
    """A wrong shortcut, the negative control: a copy is skipped as losing when exploring it
    could not pay, though forgetting brings its estimate back towards the prior."""

    def _loses(self, plan: RoundPlan) -> float | None:
        if not plan.is_copy:
            return None
        ms = self.costs.verify_costs(self.max_gamma + 1)
        return None if self.could_pay(plan, ms) else 0.0


# This CPU's verify curve as calibrated (ms, widths 1..9; docs/BENCHMARKS.md).
CPU_VERIFY = [25.3, 40.4, 52.4, 61.2, 75.0, 89.4, 98.0, 107.3, 115.5]


def _twin_play(kind: type[AdaptiveController], verify: list[float], rounds: int,
               seed: int) -> tuple[int, int]:
    """The same rounds, drawn at random, fed to `kind` and to a controller that predicts every
    round in full: (rounds whose decisions differ, rounds `kind` skipped the prediction of).
    Copies at short matches lose, at long ones win; the costs move with noisy measurements."""
    rng = np.random.default_rng(seed)
    made = [k(max_gamma=8, draft_ms=draft_table(0.3 * verify[0]), verify_ms=list(verify),
              model_name="draft-model") for k in (kind, _Predicting)]
    plans = [M] + [RoundPlan(CONTEXT, "prompt-lookup", tokens=(1,) * 8, match=m)
                   for m in (2, 3, 5, 9, 20)] + [
        RoundPlan("history", "suffix", tokens=(1,) * 8, match=m) for m in (4, 30)]
    rate = {p.acceptance_key: (0.1 if p.match < 8 else 0.9) if p.is_copy else 0.5 for p in plans}
    differ = skipped = 0
    for i in range(rounds):
        plan = plans[int(rng.integers(len(plans)))]
        a, b = (c.next_gamma(plan) for c in made)
        differ += (a.gamma, a.probing, a.prediction, a.confidence) != (
            b.gamma, b.probing, b.prediction, b.confidence)
        skipped += not a.speeds
        g = b.gamma
        survives = np.append(rng.random(g) < rate[plan.acceptance_key], False)
        accepted = int(np.argmin(survives))
        verify_ms = verify[g] * float(rng.uniform(0.9, 1.1))
        confidence = (float(rng.uniform(0.3, 1.0)),) * (accepted + 1)
        for c, d in zip(made, (a, b)):
            c.update(d, RoundStats(
                index=i, gamma=g, drafted=g, accepted=accepted, kind="x",
                committed=accepted + 1, draft_ms=0.3 * verify[0] * g if plan.model_drafts
                else 0.0, verify_ms=verify_ms, source="x" if g else "plain",
                confidence=confidence if d.confidence else ()))
    return differ, skipped


# (Each key's first `lose_after` rounds are predicted in full.)
@pytest.mark.parametrize("verify,least", [(CPU_VERIFY, 350), (VERIFY, 0)])
def test_skipping_the_prediction_of_a_losing_copy_changes_no_decision(verify, least):
    """A copy whose estimate cannot pay at any acceptance it could reach until it next learns
    is plain without its prediction (`_loses`): every decision is the full prediction's, over
    rounds of every source and match length, some copies winning, with the costs moving. On
    this CPU's curve the shortcut is taken in many rounds; on a flatter one the prior itself
    pays, so it never is. Skipping wherever exploring could not pay (forgetting brings a
    copy's estimate back towards the prior) changes decisions: the control."""
    differ, skipped = _twin_play(AdaptiveController, verify, 3000, seed=1)
    assert differ == 0 and skipped >= least
    differ, _ = _twin_play(_SkippingOnTheProbeAlone, verify, 3000, seed=1)
    assert differ > 0


def test_a_copy_known_to_lose_says_so_and_its_report_still_predicts_every_gamma():
    c = AdaptiveController(max_gamma=8, draft_ms=draft_table(7.4), verify_ms=CPU_VERIFY,
                           opening=())
    for i in range(12):
        c.estimator.learn(COPY.acceptance_key, 2, 0)
    d = c.next_gamma(COPY)
    assert d.gamma == 0 and not d.speeds and d.prediction == 1e3 / CPU_VERIFY[0]
    assert d.reason == ("plain: copying from the context at 3-token matches cannot pay (at most "
                        "0.70 accepted a token); earlier answers: lookup at 3-token matches: 0.00 "
                        "accepted over 12 rounds")
    report = c.report(d)
    expected = c.predict(COPY).speeds
    assert report.predicted_speedup == [round(float(s / expected[0]), 3) for s in expected]
    assert len(report.predicted_speedup) == 9 and max(report.predicted_speedup[1:]) < 1.0


# --- copies as long as the match (issue 62) --------------------------------------------------

# The Zen 4 verify curve, in target tokens, interpolated to the 65 widths a copy of 64
# verifies (25 ms a token).
_MEASURED = {1: 1.0, 2: 2.02, 4: 3.37, 8: 7.99, 9: 9.32, 12: 10.4, 16: 9.05, 24: 13.3,
             32: 15.6, 48: 21.8, 64: 27.8, 65: 28.2}
STEEP_65 = [25.0 * float(v) for v in np.interp(np.arange(1, 66), list(_MEASURED),
                                               list(_MEASURED.values()))]


def _copy(length: int, match: int = 40) -> RoundPlan:
    return RoundPlan(CONTEXT, "prompt-lookup", tokens=tuple(range(1, length + 1)), match=match)


def _sure_copies(**kw) -> AdaptiveController:
    """A controller on STEEP_65 whose long copies have been accepted in full (ten rounds)."""
    c = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65,
                           model_name="draft-model", opening=(), **kw)
    for _ in range(10):
        c.estimator.learn(_copy(64).acceptance_key, 64, 64)
    return c


def test_a_copy_is_priced_at_its_own_length_up_to_64_while_the_model_keeps_its_cap():
    c = _sure_copies()
    long, short = c.next_gamma(_copy(64)), c.next_gamma(_copy(3))
    # Every gamma up to the copy's own length is priced, and no further.
    assert len(long.speeds) == 65 and len(short.speeds) == 4
    assert long.gamma > 32 and "copying from the context" in long.reason
    # On this curve a copy of 8 cannot pay (9 tokens for 9.32), one of 16 can.
    assert c.next_gamma(_copy(8)).gamma == 0 and c.next_gamma(_copy(16)).gamma == 16
    c.estimator.model.tries[:] = 10.0
    c.estimator.model.hits[:] = 10.0
    assert len(c.predict(M).speeds) == 9 and c.next_gamma(M).gamma <= 8
    assert c.calibration_need() is None and make_policy("adaptive", 8).calibration_need() == 64


def test_one_failed_round_does_not_switch_a_copy_off():
    """The issue's case: one 1-token match that failed. With fewer than `lose_after` rounds
    the copy's round is predicted in full and its line says the evidence is thin; once the key
    has lost in `lose_after` rounds it is switched off, and the line says over how many."""
    c = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65, opening=())
    plan = _copy(64, match=1)
    c.estimator.learn(plan.acceptance_key, 1, 0)
    d = c.next_gamma(plan)
    assert d.gamma == 0 and d.speeds and d.reason.endswith(
        "; 1 of the 8 rounds seen that could switch it off")
    assert c._loses(plan) is None
    for _ in range(7):
        c.estimator.learn(plan.acceptance_key, 1, 0)
    d = c.next_gamma(plan)
    assert d.gamma == 0 and not d.speeds
    assert d.reason.startswith("plain: copying from the context at 1-token matches cannot pay")
    assert "over 8 rounds" in d.reason
    # The control: without the rule, the one round closes it.
    early = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65,
                               opening=(), lose_after=1)
    early.estimator.learn(plan.acceptance_key, 1, 0)
    assert early._loses(plan) is not None


def _plain(i: int, token: int) -> RoundStats:
    return RoundStats(index=i, gamma=0, drafted=0, accepted=0, kind="target", committed=1,
                      draft_ms=0.0, verify_ms=25.0, source="plain", token=token)


def test_a_copy_not_drafted_is_watched_and_teaches_its_key():
    """Plain rounds after a copy on offer are judged as its drafted tokens would have been: a
    copy of 16 whose first 5 tokens the text followed teaches its key a round of 5 accepted;
    one followed to its end, a round of 16; a round that drafts stops the watch, keeping what
    it had matched."""
    c = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65, opening=())
    plan = _copy(16, match=20)
    key = plan.acceptance_key
    for i, token in enumerate([1, 2, 3, 4, 5, 99]):
        c.update(Decision(0, plan if i == 0 else NO_PLAN), _plain(i, token))
    counts = c.estimator.counts(key)
    assert counts.rounds == 1 and counts.first_hits == 1
    assert list(counts.tries[:7] > 0) == [True] * 6 + [False]
    assert list(counts.hits[:6] > 0) == [True] * 5 + [False]
    for i, token in enumerate(range(1, 17)):
        c.update(Decision(0, plan if i == 0 else NO_PLAN), _plain(i, token))
    assert counts.rounds == 2 and counts.hits[15] > 0
    c.update(Decision(0, plan), _plain(0, 1))
    c.update(Decision(2, M), RoundStats(index=1, gamma=2, drafted=2, accepted=2, kind="bonus",
                                        committed=3, draft_ms=14.0, verify_ms=60.0,
                                        source="draft-model", token=7))
    assert counts.rounds == 3 and c._watched is None


def test_a_watched_copy_teaches_as_it_goes_and_counts_each_position_once():
    """A watched copy teaches its key at every token the text follows, before the copy ends (so
    a first answer learns a long copy while it is being written, not 64 tokens later), and when
    the text leaves it the counts are those of the whole round learned at once: each tested
    position once, aged once, one round."""
    c = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65, opening=())
    plan = _copy(16, match=20)
    key = plan.acceptance_key
    for i, token in enumerate([1, 2, 3, 4, 5]):
        c.update(Decision(0, plan if i == 0 else NO_PLAN), _plain(i, token))
    counts = c.estimator.counts(key)
    assert counts.rounds == 0 and c._watched is not None
    assert list(counts.hits[:6] > 0) == [True] * 5 + [False]
    assert c.estimator.acceptance(key)[0] > c.estimator.prior(key)
    c.update(Decision(0, NO_PLAN), _plain(5, 99))
    whole = Counts()
    whole.learn(16, 5, c.estimator.constants.decay)
    assert np.array_equal(counts.tries, whole.tries) and np.array_equal(counts.hits, whole.hits)
    assert (counts.rounds, counts.first_hits) == (1, 1)


def test_a_shorter_gamma_that_pays_is_drafted_when_the_fastest_misses_the_margin():
    """On the measured H200 profile (a draft token 0.50 of a target token), after plain rounds
    (the resuming margin) at acceptance 0.87: gamma 2 is the fastest but misses the margin,
    which grows with a round's risk; gamma 1 pays by it, so the round drafts 1 (asking the
    fastest gamma alone kept whole answers plain, issue 62)."""
    from bench.benchmark.gpu_profile import measured
    gpu = measured()
    c = AdaptiveController(max_gamma=8, draft_ms=gpu.draft_table(COPY_MAX + 1),
                           verify_ms=gpu.verify_table(COPY_MAX + 1), model_name="draft-model",
                           opening=())
    n, a = 1000, 0.87
    c.estimator.restore({"keys": {MODEL: {"tries": [n] * 8, "hits": [n * a] * 8, "rounds": n,
                                          "first_hits": round(n * a)}},
                         "scale_hits": 0.0, "scale_conf": 0.0})
    p = c.predict(M)
    margin = c.constants.resume_margin
    assert c.speculating is None and c._margin(M) == margin
    fastest = int(np.argmax(p.speeds[1:])) + 1
    assert fastest == 2 and not c._pays(2, p.expected, p.ms, margin)
    assert c._pays(1, p.expected, p.ms, margin)
    d = c.next_gamma(M)
    assert d.gamma == 1 and d.reason.startswith("gamma 1: predicted 1.16x")


def test_a_longer_match_starts_from_a_shorter_ones_evidence():
    """A copy at a match length nothing is known of is shrunk towards the pooled rate of a
    shorter match of its source when that is higher (a longer match is no worse a bet): one
    watched 64-token copy kept in full at 3-token matches lets the copy at 16-31 draft at once
    on the steep curve; a shorter match that lost leaves the prior as it was. The control: the
    same evidence under another source does not carry."""
    c = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65, opening=())
    long = _copy(64, match=20)
    assert c.next_gamma(long).gamma == 0
    assert c.estimator.prior(long.acceptance_key) == c.constants.prior
    c.estimator.learn(RoundPlan(CONTEXT, match=3).acceptance_key, 64, 64)
    assert c.estimator.prior(long.acceptance_key) > 0.95
    assert c.next_gamma(long).gamma > 16
    # A shorter match's evidence reaches no shorter key, and no other source.
    assert c.estimator.prior(RoundPlan(CONTEXT, match=2).acceptance_key) == c.constants.prior
    other = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65,
                               opening=())
    other.estimator.learn(RoundPlan(HISTORY, match=3).acceptance_key, 64, 64)
    assert other.next_gamma(long).gamma == 0
    lost = AdaptiveController(max_gamma=8, draft_ms=[7.0] * 65, verify_ms=STEEP_65, opening=())
    for _ in range(3):
        lost.estimator.learn(RoundPlan(CONTEXT, match=3).acceptance_key, 8, 0)
    assert lost.estimator.prior(long.acceptance_key) == lost.constants.prior


def test_the_kept_paying_bounds_answer_as_the_direct_computation_does():
    """`_model_pays` keeps, per margin and cost shape, where paying starts: at every acceptance,
    margin and cost curve it answers as `_first_paying` itself does (a bound on the wrong side
    of the threshold would flip decisions near it)."""
    from engine.control.controller import _first_paying
    rng = np.random.default_rng(7)
    inside = 0
    for trial in range(40):
        # Flat (a GPU's) to steep (a CPU's) curves, a draft token at 0.01-0.6 of a target's.
        slope = float(rng.uniform(0.02, 1.0))
        verify = [100.0 * (1.0 + slope * w) for w in range(9)]
        c = AdaptiveController(max_gamma=8, draft_ms=draft_table(float(rng.uniform(1, 60))),
                               verify_ms=verify, model_name="draft-model")
        costs = c.costs
        assert costs is not None
        rounds = c._model_round_costs(costs)
        for margin in (0.0, 0.1, 0.3):
            for a in np.concatenate((rng.uniform(0.0, 1.0, 60), [0.0, 1.0])).tolist():
                assert c._model_pays(a, margin) == (_first_paying(a, rounds, margin) <= 8), (
                    trial, margin, a)
            lo, hi = c._floors[margin]
            inside += 0.0 < lo < 1.0
            # Near the threshold too: just outside each bound.
            for a in (lo, hi, lo - 1e-9, hi + 1e-9):
                assert c._model_pays(a, margin) == (_first_paying(a, rounds, margin) <= 8)
    # Most curves start paying somewhere inside (0, 1), where a wrong bound would show.
    assert inside >= 40


def test_the_paying_bounds_follow_the_draft_cost_and_the_curve_shape():
    """A draft that got dearer (a model round's measurement) or a verify curve that changed
    shape (a wide round's) is priced afresh: the kept bounds are dropped."""
    c = controller(per_token=5.0)
    costs = c.costs
    assert costs is not None
    assert c._model_pays(0.8, 0.1)
    stamp = c._floors_stamp
    for _ in range(40):
        costs.learn_draft(500.0, 1, 0)
    assert (costs.shape, costs.draft_shape) != stamp
    assert not c._model_pays(0.8, 0.1)


def test_the_estimators_top_is_its_expected_rows_largest():
    c = controller()
    est = c.estimator
    rng = np.random.default_rng(3)
    for _ in range(30):
        g = int(rng.integers(1, 9))
        est.learn(MODEL, g, int(rng.integers(0, g + 1)))
        est.observe_confidence(float(rng.uniform()))
        for n in (1, 4, 8):
            assert est.top(MODEL, n) == float(est.expected(MODEL, n)[0].max())
