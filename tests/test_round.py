"""One round read on its own: `run_round` hands back the policy's decision, the round's
statistics and the tokens it offers to commit; the policy takes its decision back unchanged."""
from __future__ import annotations

import doctest
import types

import engine.control.costs
import engine.control.policy
import engine.round
import engine.round_plan
from engine.drafters.draft_model import DraftModelDrafter
from engine.control.batch import ALONE
from engine.control.policy import Decision, FixedGamma
from engine.round import Rounds, run_round
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.backend import FakeBackend

PROMPT = [3, 14, 15, 9, 26]


# The examples each module's docstrings hold: deleting one (or all) must fail the test too.
EXAMPLES = {engine.round: 1, engine.round_plan: 3, engine.control.policy: 1,
            engine.control.costs: 7}


def test_the_docstring_examples_hold():
    for module, n in EXAMPLES.items():
        result = doctest.testmod(module)
        assert (result.failed, result.attempted) == (0, n), module.__name__


def test_a_wrong_docstring_example_is_counted_as_failed():
    """The negative control: doctest, as called above, sees a wrong example."""
    module = types.ModuleType("wrong", ">>> 1 + 1\n3\n")
    result = doctest.testmod(module, report=False)
    assert (result.failed, result.attempted) == (1, 1)


def test_a_round_offers_its_accepted_drafts_then_the_targets_token():
    target = Session(FakeBackend())
    target.sync(PROMPT, feed_last=False)
    drafter = DraftModelDrafter(FakeBackend(noise=0.5))
    drafter.prefill(PROMPT)
    rounds = Rounds(target, drafter, FixedGamma(3), SamplingParams(temperature=0.0), Rng(0))
    result = run_round(rounds, PROMPT, room=2, index=0)
    s = result.stats
    assert result.decision == Decision(3, drafter.plan(PROMPT, SamplingParams(temperature=0.0)),
                                       reason="fixed: gamma 3 every round")
    assert result.decision.plan.behind == 1 and result.decision.plan.source == "model"
    # The room caps the round, not the decision.
    assert s.gamma == 2 and s.drafted == 2 and not s.is_copy
    assert len(result.tokens) == s.accepted + 1 == len(result.origins)
    assert result.origins[:s.accepted] == ("draft",) * s.accepted
    # Nothing is committed yet, and the target's cache holds the accepted drafts only.
    assert s.committed == 0
    assert target.tokens == PROMPT[:-1] + [PROMPT[-1]] + list(result.tokens[:s.accepted])


def test_each_round_plans_once_and_predicts_once():
    """The drafter is asked one question a round (its plan: prompt lookup's match runs once),
    and the controller prices every gamma from one prediction of that plan."""
    from engine.control.controller import AdaptiveController
    from engine.drafters.hybrid import HybridDrafter
    from engine.drafters.prompt_lookup import PromptLookupDrafter
    from engine.events import RoundEvent
    from engine.generation_config import GenerationConfig
    from engine.generator import generate

    calls = {"find": 0, "predict": 0}

    class CountingLookup(PromptLookupDrafter):
        def find(self, context, want):
            calls["find"] += 1
            return super().find(context, want)

    class CountingController(AdaptiveController):
        def predict(self, plan, batch=ALONE):
            calls["predict"] += 1
            return super().predict(plan, batch)

    drafter = HybridDrafter(CountingLookup(ngram_min=2), DraftModelDrafter(FakeBackend(noise=0.5)))
    policy = CountingController(max_gamma=4, draft_ms=[1.0] * 5, verify_ms=[10.0, 11, 12, 13, 14],
                                model_name="draft-model")
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=4, max_tokens=40)
    rounds = [e.round for e in generate(Session(FakeBackend()), drafter, PROMPT * 3, config,
                                        policy) if isinstance(e, RoundEvent)]
    assert any(r.is_copy and r.drafted for r in rounds) and any(not r.is_copy and r.drafted
                                                                   for r in rounds)
    assert calls == {"find": len(rounds), "predict": len(rounds)}
