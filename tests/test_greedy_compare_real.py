"""The one rule for comparing greedy outputs of a real model (bench/exactness/greedy.py): outputs
part only where the target's two candidates are closer than batch numerics can move them. Its
negative control: a drafter whose tokens are accepted without verification must fail it."""
from __future__ import annotations

import numpy as np
import pytest

from engine.acceptance import Verdict
from engine.drafters.base import Drafter, Proposal
from engine.events import DoneEvent
from bench.exactness.greedy import (NEAR_TIE_GAP, GreedyMismatch, check_near_tie,
                                     near_tie_divergence)
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.sampling import SamplingParams
from engine.session import Session

pytestmark = pytest.mark.real

PROMPT = "def fibonacci(n):\n    "
GREEDY = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=3, max_tokens=12)


class ConstantDrafter(Drafter):
    """Proposes the same token every time: wrong almost everywhere."""

    name = "constant"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, plan, gamma, params, rng, keep=None) -> Proposal:
        return Proposal(tokens=np.full(gamma, self.token, dtype=np.int32), source=self.name)


def unverified(p, q, draft, rng, greedy) -> Verdict:
    """Accepts every drafted token without looking at the target: the bug the rule must catch."""
    return Verdict(len(draft), p[len(draft)].argmax(), "bonus")


def tokens(target: Session, drafter: Drafter | None, prompt: list[int], rule=None) -> tuple:
    kwargs = {"rule": rule} if rule is not None else {}
    events = list(generate(target, drafter, prompt, GREEDY, **kwargs))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].tokens


def test_identical_outputs_pass_and_unverified_drafts_are_caught(embedded_backends, capsys):
    target = Session(embedded_backends[0])
    prompt = target.backend.tokenize(PROMPT)
    plain = tokens(target, None, prompt)
    assert check_near_tie(target, prompt, plain, plain).position is None

    zebra = target.backend.tokenize(" zebra", add_special=False)[0]
    wrong = tokens(target, ConstantDrafter(zebra), prompt, rule=unverified)
    d = near_tie_divergence(target, prompt, plain, wrong)
    assert d.position == 0 and d.gap > NEAR_TIE_GAP
    with pytest.raises(GreedyMismatch, match="first difference at token 0"):
        check_near_tie(target, prompt, plain, wrong)
    # The position and the gap are printed beside the test's result.
    assert "logits of the two tokens are" in capsys.readouterr().out
