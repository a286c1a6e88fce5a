"""One round read on its own: `run_round` hands back the policy's decision, the round's
statistics and the tokens it offers to commit; the policy takes its decision back unchanged."""
from __future__ import annotations

import doctest

import engine.control.policy
import engine.round
from engine.drafters.draft_model import DraftModelDrafter
from engine.control.policy import Decision, FixedGamma
from engine.round import Rounds, run_round
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from tests.fakes import FakeBackend

PROMPT = [3, 14, 15, 9, 26]


def test_the_docstring_examples_hold():
    for module in (engine.round, engine.control.policy):
        assert doctest.testmod(module).failed == 0


def test_a_round_offers_its_accepted_drafts_then_the_targets_token():
    target = Session(FakeBackend())
    target.sync(PROMPT, feed_last=False)
    drafter = DraftModelDrafter(FakeBackend(noise=0.5))
    drafter.prefill(PROMPT)
    rounds = Rounds(target, drafter, FixedGamma(3), SamplingParams(temperature=0.0), Rng(0))
    result = run_round(rounds, PROMPT, room=2, index=0)
    s = result.stats
    assert result.decision == Decision(3, reason="fixed: gamma 3 every round", behind=1)
    # The room caps the round, not the decision.
    assert s.gamma == 2 and s.drafted == 2 and not s.copied
    assert len(result.tokens) == s.accepted + 1 == len(result.origins)
    assert result.origins[:s.accepted] == ("draft",) * s.accepted
    # Nothing is committed yet, and the target's cache holds the accepted drafts only.
    assert s.committed == 0
    assert target.tokens == PROMPT[:-1] + [PROMPT[-1]] + list(result.tokens[:s.accepted])
