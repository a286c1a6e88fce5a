"""Exact enumeration of copies with substitutions (engine/drafters/substitutions.py): the law of
a whole answer whose target renames an identifier at each occurrence with probability one half,
drafted by long copies from the prompt (prompt lookup) and from a prediction that learn the
rename, equals the target's law; a control that substitutes only where the verifier's next coin
will accept (it peeks at the token the target is about to give) is caught.

The source holds OLD three times among filler; the target follows it one-hot, and at each OLD
gives OLD or NEW evenly, then ends. So a rename is learnt where the answer wrote NEW, the next
copy drafts NEW for OLD, and a pair the answer stops following (it wrote OLD) is dropped: every
case is enumerated, each with its probability.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.control.controller import AdaptiveController
from engine.drafters.base import Proposal
from engine.drafters.prediction import PredictionDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.substitutions import Substitutions
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import TableFake, VirtualClock
from tests.exact_law import EnumeratingRng, exact_law, target_law, total_variation

V, EOG, OLD, NEW = 8, 7, 5, 6
_fill = np.random.default_rng(11)


def _filler(n: int) -> list[int]:
    return [int(t) for t in _fill.integers(1, 5, n)]


SOURCE = [*_filler(7), OLD, *_filler(6), OLD, *_filler(6), OLD, *_filler(4)]
# The prompt ends with the source's first three tokens, so the answer's first copy is the source
# from its fourth token on: the answer is the rest of the source, renamed or not at each OLD.
PROMPT = [*SOURCE, *SOURCE[:3]]
ANSWER = SOURCE[3:]
N = len(ANSWER) + 1
FLAT = [10.0] * 65


class RenameTarget(TableFake):
    """The answer ANSWER with each OLD given as OLD or NEW evenly, then the end."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        super().__init__(n_vocab=V, eog=EOG, clock=clock, cost=FLAT)

    def _row(self, context):
        row = np.full(V, -np.inf, dtype=np.float32)
        out = list(context[len(PROMPT):])
        for j, t in enumerate(out):
            if j >= len(ANSWER) or t not in ((OLD, NEW) if ANSWER[j] == OLD else (ANSWER[j],)):
                row[EOG] = 0.0
                return row
        j = len(out)
        if j == len(ANSWER):
            row[EOG] = 0.0
        elif ANSWER[j] == OLD:
            row[OLD] = row[NEW] = 0.0
        else:
            row[ANSWER[j]] = 0.0
        return row


class PeekingLookup(PromptLookupDrafter):
    """The negative control: prompt lookup whose copy keeps its first NEW only where the
    verifier's coin for that position will accept (it reads the enumeration's next choices,
    the token the target is about to give), else drafts OLD there."""

    def propose(self, plan, gamma, params, rng: Rng, keep=None, guide=None) -> Proposal:
        proposal = super().propose(plan, gamma, params, rng, keep)
        tokens = proposal.tokens.copy()
        hits = np.flatnonzero(tokens == NEW)
        if len(hits) and isinstance(rng, EnumeratingRng):
            j = int(hits[0])
            depth = len(rng.taken) + j
            if depth < len(rng.path) and rng.path[depth] != 0:
                tokens[j] = OLD
        return Proposal(tokens=tokens, q=None, source=proposal.source)


def lookup(control: bool = False) -> PromptLookupDrafter:
    kind = PeekingLookup if control else PromptLookupDrafter
    return kind(ngram_max=3, ngram_min=2, is_eog=lambda t: t == EOG)


DRAFTERS = {
    "lookup": lambda: lookup(),
    "prediction": lambda: PredictionDrafter(lookup(), ANSWER, PROMPT),
    "control": lambda: lookup(control=True),
}


def rename_law(kind: str, monkeypatch) -> tuple[dict, dict, int]:
    """(speculative law, target law, copies that drafted a substitution) of the whole answer."""
    params = SamplingParams(temperature=1.0)
    rewrites = [0]
    plain = Substitutions.rewrite

    def counting(self, source, start, stop, limit):
        out = plain(self, source, start, stop, limit)
        rewrites[0] += out != [int(t) for t in source[start:stop]][:limit]
        return out

    monkeypatch.setattr(Substitutions, "rewrite", counting)

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(RenameTarget(clock))
        policy = AdaptiveController(max_gamma=2, draft_ms=[0.0] * 65, verify_ms=FLAT,
                                    opening=())
        config = GenerationConfig(params=params, gamma=2, max_tokens=N)
        done = [ev for ev in generate(target, DRAFTERS[kind](), PROMPT, config, policy,
                                      rng=rng, clock=clock.now) if isinstance(ev, DoneEvent)]
        return done[0].tokens

    spec = exact_law(run)
    return spec, target_law(RenameTarget(), PROMPT, params, N), rewrites[0]


@pytest.mark.parametrize("kind", ["lookup", "prediction"])
def test_copies_with_substitutions_emit_the_targets_law_exactly(kind, monkeypatch):
    spec, want, rewrites = rename_law(kind, monkeypatch)
    # Eight ways to rename, each answer ending in the end token.
    assert len(want) == 8 and rewrites > 0
    assert sum(spec.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(spec, want) < 1e-9


def test_a_substitution_that_peeks_at_the_targets_token_is_caught(monkeypatch):
    spec, want, rewrites = rename_law("control", monkeypatch)
    assert rewrites > 0 and total_variation(spec, want) > 1e-3
