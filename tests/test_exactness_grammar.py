"""Exact enumeration under a grammar: the law of the answer's first tokens, over every random
choice the engine makes, equals plain *constrained* sampling's law (the target's rows masked
at each position by the grammar's state) to 1e-9, for every drafter and policy, T=1,
T=0.7 + top-p, top-k with ties at its boundary, and greedy; with both representations of a
masked row (engine/grammar/mask.py); with forced tokens and chains of them committed without a
model. Two negative controls must fail: a draft whose q is not masked (only p is), and a
jump over a byte string the grammar forces with one of its two tokenizations.

The grammar and its vocabulary are tests/grammar_fakes.py's; the fakes, drafters and policies
those of tests/test_exactness_enumeration.py.
"""
from __future__ import annotations

import pytest

from engine import generator as engine_generator
from engine.drafters.draft_model import DraftModelDrafter
from engine.errors import DraftLawError
from engine.events import FORCED, DoneEvent, RoundEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.grammar import mask as grammar_mask
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import TableFake, VirtualClock
from tests.exact_law import exact_law, total_variation
from tests.grammar_fakes import (END, AutomatonConstraint, AutomatonGrammar, ByteJumpGuide,
                                 constrained_law)
from tests.test_exactness_enumeration import DRAFT, VERIFY, make_drafter, make_policy

N = 4
PROMPT = [0, 1, 2, 3, 4, 5, 6, 1, 2]
SAMPLINGS = {
    "T=1": (SamplingParams(temperature=1.0), 0.0),
    "T=0.7 top-p 0.9": (SamplingParams(temperature=0.7, top_p=0.9), 0.0),
    "top-k 2 with ties": (SamplingParams(temperature=1.0, top_k=2), 0.5),
    "greedy": (SamplingParams(temperature=0.0), 0.0),
}
DRAFTERS = ("draft-model", "lookup", "hybrid", "trimmed-vocab", "early-exit")


def law_of(sampling: str, build_drafter, policy: str = "fixed") -> tuple[dict, dict, dict]:
    """(speculative law, constrained target law, counts: leaves that drafted, that forced)."""
    params, grid = SAMPLINGS[sampling]
    seen = {"drafted": 0, "forced": 0, "forced end": 0}

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(TableFake(seed=1, eog=END, grid=grid, clock=clock, cost=VERIFY))
        drafter = build_drafter(clock, grid)
        config = GenerationConfig(params=params, gamma=2, max_tokens=N,
                                  grammar=AutomatonGrammar())
        events = list(generate(target, drafter, PROMPT, config, make_policy(policy, drafter),
                               rng=rng, clock=clock.now))
        done = events[-1]
        assert isinstance(done, DoneEvent)
        seen["drafted"] += done.stats.drafted_tokens > 0
        seen["forced"] += any(isinstance(e, TokenEvent) and e.origin == FORCED for e in events)
        rounds = [e.round for e in events if isinstance(e, RoundEvent)]
        seen["forced end"] += bool(rounds) and rounds[-1].width == 0
        return done.tokens

    spec = exact_law(run)
    fake = TableFake(seed=1, eog=END, grid=grid)
    return spec, constrained_law(fake._row, PROMPT, params, N), seen


@pytest.mark.parametrize("share", [0.0, 1.0], ids=["dense-mask", "sparse-mask"])
@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_drafter_emits_the_constrained_targets_law_exactly(drafter, sampling, share,
                                                                  monkeypatch):
    monkeypatch.setattr(grammar_mask, "SPARSE_SHARE", share)
    spec, want, seen = law_of(sampling, lambda c, g: make_drafter(drafter, c, g))
    assert sum(spec.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(spec, want) < 1e-9
    # The case speculated, and committed forced tokens (greedy's one answer may pass none) and,
    # where truncation leaves the path to it ("e" first), a forced end.
    assert seen["drafted"] > 0
    assert seen["forced"] > 0 or sampling == "greedy"
    assert seen["forced end"] > 0 or sampling != "T=1"


@pytest.mark.parametrize("policy", ["adaptive", "adaptive-opening", "heuristic", "plain"])
@pytest.mark.parametrize("sampling", ["T=1", "greedy"])
def test_every_policy_emits_the_constrained_targets_law_exactly(policy, sampling):
    spec, want, seen = law_of(sampling, lambda c, g: make_drafter("hybrid", c, g), policy)
    assert total_variation(spec, want) < 1e-9
    if policy == "plain":
        assert seen["drafted"] == 0


def test_plain_decoding_decodes_forced_tokens_with_the_target():
    """Plain constrained decoding is the baseline: one target call per token, forced or not."""
    clock = VirtualClock()
    target = Session(TableFake(seed=1, eog=END, clock=clock, cost=VERIFY))
    config = GenerationConfig(params=SamplingParams(temperature=1.0, seed=3), gamma=0,
                              max_tokens=12, grammar=AutomatonGrammar())
    done = list(generate(target, None, PROMPT, config, clock=clock.now))[-1]
    assert done.stats.forced_tokens == 0
    assert done.stats.target_calls == len(done.tokens) + (done.stats.finish_reason == "eos")


def test_forced_tokens_run_no_model():
    """Greedy speculation on the grammar: the forced tokens ("d" after "c", "e" after "cd"
    where a round starts) are committed without a target call, and the answer needs fewer
    target calls than tokens."""
    clock = VirtualClock()
    target = Session(TableFake(seed=1, eog=END, clock=clock, cost=VERIFY))
    drafter = DraftModelDrafter(TableFake(seed=1, noise=0.8, eog=END, clock=clock, cost=DRAFT))
    config = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=2, max_tokens=16,
                              grammar=AutomatonGrammar())
    events = list(generate(target, drafter, PROMPT, config, clock=clock.now))
    done = events[-1]
    origins = [e.origin for e in events if isinstance(e, TokenEvent)]
    assert done.stats.forced_tokens == origins.count(FORCED) > 0
    assert done.stats.target_calls < len(done.tokens)
    # A forced token is one the grammar allows alone where it stands.
    c = AutomatonConstraint()
    for token, origin in zip(done.tokens, origins):
        assert origin != FORCED or c.mask().single == token
        assert c.consume([token]) == 1


# --- negative controls --------------------------------------------------------------------------

class UnmaskedDraft(DraftModelDrafter):
    """A draft model that says it masks its rows but drafts from them unmasked: only p is
    constrained (the round still cuts the draft before a token the grammar forbids, which reads
    that token)."""

    def propose(self, plan, gamma, params, rng, keep=None, guide=None):
        return super().propose(plan, gamma, params, rng, keep)


# At T = 1 the unmasked draft's rows are wide and the enumeration takes 15-40 s; T = 0.7 + top-p
# catches it in a tenth of a second, so T = 1 runs with --all.
@pytest.mark.parametrize("sampling", [pytest.param("T=1", marks=pytest.mark.long),
                                      "T=0.7 top-p 0.9"])
def test_masking_only_p_is_caught(sampling):
    spec, want, seen = law_of(sampling, lambda c, g: UnmaskedDraft(
        TableFake(seed=1, noise=0.8, eog=END, grid=g, clock=c, cost=DRAFT)))
    assert seen["drafted"] > 0
    assert total_variation(spec, want) > 1e-3


def test_a_sampling_drafter_that_does_not_mask_is_refused():
    class Unguided(DraftModelDrafter):
        guided = False

    with pytest.raises(DraftLawError, match="does not mask it by the grammar"):
        law_of("T=1", lambda c, g: Unguided(TableFake(seed=1, noise=0.8, eog=END, clock=c,
                                                      cost=DRAFT)))


def test_jumping_a_forced_byte_string_with_one_tokenization_is_caught(monkeypatch):
    """After "b" the grammar forces the bytes "cd", which the target may spell "cd" or "c" "d":
    no token is forced there. Jumping with the one-token spelling (what a forced-bytes
    fast-forward does) changes the law; the engine, which forces only what the mask allows
    alone, does not."""
    monkeypatch.setattr(engine_generator, "Guide", ByteJumpGuide)
    spec, want, _ = law_of("T=1", lambda c, g: make_drafter("draft-model", c, g))
    # The enumeration is exact (the engine's own TV here is under 1e-15), so a TV a million
    # times the tolerance is the bias itself: 0.0010 (the jump changes an answer only where "b"
    # or "ab" comes first and the target would have spelt the "cd" within four tokens "c" "d").
    assert total_variation(spec, want) > 1e-6


def test_the_automaton_forces_what_its_mask_allows_alone():
    c = AutomatonConstraint()
    assert c.mask().single is None
    assert c.consume([1, 3]) == 2           # "b" "c": only "d" may follow
    assert c.mask().single == 4
    c.rollback(1)                           # after "b": "c" or "cd", the bytes "cd" forced
    assert sorted(c.mask().ids().tolist()) == [3, 5] and c.mask().single is None
    assert c.consume([5, 6, 0]) == 3 and c.consume([6]) == 0
