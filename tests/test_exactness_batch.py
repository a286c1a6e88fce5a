"""Exact enumeration of two sequences sharing a batch (engine/batch_step.py): over every random
choice of both, the pair of answers has the product of the two targets' laws, and each answer
is the one its sequence gives alone on the same choices, whoever shares its batch. The negative
control gives both sequences one random stream: an answer then depends on its batch-mate's
draws, and the enumeration catches it.

The fakes of tests/test_exactness_enumeration.py, two tokens per answer (the product of two
trees stays small), policies whose decisions read only their own sequence (the fixed and the
heuristic gamma; the adaptive one reads a clock that both sequences advance).
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Callable

import pytest

from tests.fakes.threads import run_each
from bench.fakes.table import TableFake, VirtualClock
from engine.batch_step import BatchStep
from engine.control.policy import FixedGamma, GammaPolicy, HeuristicGamma
from engine.drafters.base import Drafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.seq_backend import SeqBackend
from engine.session import Session
from tests.exact_law import EnumeratingRng, target_law, total_variation
from tests.test_exactness_enumeration import DRAFT, EOG, PROMPT, VERIFY

N = 2
PROMPTS = (PROMPT, [6, 5, 4, 3, 2, 1, 0, 4, 3])
PARAMS = SamplingParams(temperature=0.7, top_p=0.9)
DRAFTERS = ("draft-model", "hybrid", "lookup")
POLICIES = {"fixed": lambda: FixedGamma(2), "heuristic": lambda: HeuristicGamma(1)}


def drafter_on(kind: str, draft) -> Drafter:
    lookup = PromptLookupDrafter(ngram_max=2, ngram_min=2 if kind == "hybrid" else 1,
                                 is_eog=lambda t: t == EOG)
    if kind == "lookup":
        return lookup
    model = DraftModelDrafter(draft, p_min=0.2, chain_min=0.5)
    return model if kind == "draft-model" else HybridDrafter(lookup, model)


def answer(target, draft, prompt, kind: str, policy: GammaPolicy, rng: Rng,
           clock: VirtualClock, mates: BatchStep | None = None) -> tuple[int, ...]:
    config = GenerationConfig(params=PARAMS, gamma=2, max_tokens=N)
    events = generate(Session(target), drafter_on(kind, draft), prompt, config, policy,
                      rng=rng, clock=clock.now, mates=mates)
    return next(ev for ev in events if isinstance(ev, DoneEvent)).tokens


def fakes(clock: VirtualClock) -> tuple[TableFake, TableFake]:
    return (TableFake(seed=1, eog=EOG, clock=clock, cost=VERIFY),
            TableFake(seed=1, noise=0.8, eog=EOG, clock=clock, cost=DRAFT))


def in_batch(kind: str, policy: str, rngs: tuple[Rng, Rng]) -> tuple:
    """Both answers, each generation in its own thread on its own sequences of shared
    models, decoded in shared batches."""
    clock = VirtualClock()
    target, draft = fakes(clock)
    step = BatchStep()
    out: list = [None, None]
    # Both join before either decodes, so they share the batch from the prompt on.
    joined = threading.Barrier(2)

    def run(k: int, errors: list[BaseException]) -> None:
        try:
            with step.sequence():
                joined.wait()
                # The step as the rounds' mates: a sampled draft that stops early idles
                # through the draft decodes it promised.
                out[k] = answer(SeqBackend(target, k + 1, step), SeqBackend(draft, k + 1, step),
                                PROMPTS[k], kind, POLICIES[policy](), rngs[k], clock, step)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    run_each(run, 2)
    assert any(len(b) == 2 for b in target.batches), "the sequences never shared a call"
    return tuple(out)


def joint_law(run: Callable[[EnumeratingRng, EnumeratingRng], tuple]) -> tuple[dict, list]:
    """{(answer A, answer B): probability} over every choice of both random streams (B's tree
    below each leaf of A's), and each leaf as (A's choices, B's choices, answers)."""
    law: dict = defaultdict(float)
    leaves = []
    stack: list[tuple[list[int], list[int]]] = [([], [])]
    while stack:
        path_a, path_b = stack.pop()
        a, b = EnumeratingRng(path_a), EnumeratingRng(path_b)
        out = run(a, b)
        law[out] += a.prob * b.prob
        leaves.append((tuple(a.taken), tuple(b.taken), out))
        assert len(leaves) < 50_000, "shrink the case"
        for depth in range(len(path_b), len(b.sizes)):
            stack += [(path_a, b.taken[:depth] + [alt]) for alt in range(1, b.sizes[depth])]
        if not path_b:
            for depth in range(len(path_a), len(a.sizes)):
                stack += [(a.taken[:depth] + [alt], []) for alt in range(1, a.sizes[depth])]
    return dict(law), leaves


def alone(kind: str, policy: str, k: int, path: tuple[int, ...]) -> tuple:
    """Sequence k's answer alone on the whole models, making the choices `path` (and the
    choices it made: `path` itself when its own stream made every choice it read)."""
    clock = VirtualClock()
    target, draft = fakes(clock)
    rng = EnumeratingRng(list(path))
    try:
        out = answer(target, draft, PROMPTS[k], kind, POLICIES[policy](), rng, clock)
    except IndexError:
        # A choice of `path` is not one this sequence can make alone.
        return None, path
    return out, tuple(rng.taken)


def product_law() -> dict:
    a, b = (target_law(TableFake(seed=1, eog=EOG), p, PARAMS, N) for p in PROMPTS)
    return {(x, y): pa * pb for x, pa in a.items() for y, pb in b.items()}


def mismatches(kind: str, policy: str, leaves: list) -> int:
    """Leaves where an answer differs from its sequence's alone on its own choices."""
    cache: dict = {}
    bad = 0
    for taken_a, taken_b, (out_a, out_b) in leaves:
        for k, taken, out in ((0, taken_a, out_a), (1, taken_b, out_b)):
            key = (k, taken)
            if key not in cache:
                cache[key] = alone(kind, policy, k, taken)
            bad += cache[key] != (out, taken)
    return bad


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", DRAFTERS)
def test_two_sequences_in_one_batch_each_keep_their_law_and_their_answer(kind, policy):
    law, leaves = joint_law(lambda a, b: in_batch(kind, policy, (a, b)))
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(law, product_law()) < 1e-9
    assert mismatches(kind, policy, leaves) == 0
    # Both streams branched: the case has more than one answer for each sequence.
    assert len({out[0] for out in law}) > 1 and len({out[1] for out in law}) > 1


def test_one_random_stream_shared_by_the_batch_is_caught():
    """Both sequences draw from A's stream: each draw is still from its own sequence's
    distribution, but an answer now depends on what its batch-mate drew."""
    law, leaves = joint_law(lambda a, b: in_batch("draft-model", "fixed", (a, a)))
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert mismatches("draft-model", "fixed", leaves) > 0
