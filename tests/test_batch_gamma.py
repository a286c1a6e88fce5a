"""A round is priced beside its batch-mates (engine/round.py `Rounds.mates`, engine/batch_step.py
`report` and `batch`) only where that cannot move its answer (engine/generator.py
`batch_priced`): at greedy, and sampled without a seed. A seeded sampled answer is priced alone
and comes out the same in any batch. The negative control prices a seeded stream beside a crowded
batch: its draws move, and its answer with them."""
from __future__ import annotations

from functools import partial

import pytest

from bench.fakes.backend import FakeBackend
from engine.control.batch import ALONE, Batch, Share
from engine.control.policy import Decision, GammaPolicy
from engine.drafters.draft_model import DraftModelDrafter
from engine.events import DoneEvent, RoundEvent
from engine.generation_config import GenerationConfig
from engine.generator import batch_priced, generate
from engine.pair import Pair
from engine.rng import Rng
from engine.round_plan import NO_PLAN, RoundPlan
from engine.sampling import SamplingParams
from engine.session import Session
from tests.test_batch import PROMPTS, join_in_turn

PROMPT = [3, 14, 15, 9, 26]
CROWD = Batch(sequences=4, other_width=15, other_tokens=6.0, other_drafts=(4, 4, 4))


class Crowd:
    """Batch-mates that always fill the step (`CROWD`), and keep what the rounds report."""

    def __init__(self) -> None:
        self.reported: list[Share] = []

    def batch(self) -> Batch:
        return CROWD

    def report(self, share: Share) -> None:
        self.reported.append(share)

    def draft_parts(self, n: int) -> None:
        pass


class BatchShy(GammaPolicy):
    """Drafts 4 alone and 1 in a batch, keeping the batches it was given."""

    name = "batch-shy"

    def __init__(self) -> None:
        self.seen: list[Batch] = []

    def next_gamma(self, plan: RoundPlan = NO_PLAN, batch: Batch = ALONE) -> Decision:
        self.seen.append(batch)
        return Decision(4 if batch.alone else 1, plan, batch=batch)

    def update(self, decision, r) -> None:
        pass


def run(params: SamplingParams, mates=None, rng: Rng | None = None):
    """The answer's tokens, the gammas its rounds drafted and the batches its policy saw."""
    policy = BatchShy()
    config = GenerationConfig(params=params, gamma=4, max_tokens=40)
    events = list(generate(Session(FakeBackend(seed=0)),
                           DraftModelDrafter(FakeBackend(seed=0, noise=0.5)), PROMPT, config,
                           policy, rng=rng, mates=mates))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    gammas = [ev.round.gamma for ev in events if isinstance(ev, RoundEvent)]
    return done.tokens, gammas, policy.seen


def test_a_seeded_sampled_answer_is_priced_alone_and_is_the_same_beside_a_crowd():
    params = SamplingParams(temperature=0.8, top_k=20, seed=5)
    assert not batch_priced(params)
    alone, _, _ = run(params)
    crowd = Crowd()
    beside, gammas, seen = run(params, crowd)
    assert beside == alone
    assert all(b.alone for b in seen) and max(gammas) == 4
    # It still tells its mates what it puts into each step.
    assert crowd.reported and all(s.rows >= 1 and s.tokens >= 1 for s in crowd.reported)


def test_control_a_seeded_stream_priced_beside_a_crowd_draws_differently():
    """What `batch_priced` prevents: the same random stream, its gamma cut by the batch, gives
    another answer (the law of each is the target's; the draws are not the same ones)."""
    params = SamplingParams(temperature=0.8, top_k=20)  # no seed: priced beside the batch
    assert batch_priced(params)
    alone, _, _ = run(params, rng=Rng(5))
    beside, gammas, seen = run(params, Crowd(), rng=Rng(5))
    assert not any(b.alone for b in seen) and set(gammas) <= {0, 1}
    assert beside != alone


def test_greedy_is_priced_beside_the_batch_and_its_answer_does_not_move():
    params = SamplingParams()
    assert batch_priced(params)
    alone, alone_gammas, _ = run(params)
    beside, gammas, seen = run(params, Crowd())
    assert seen and all(b == CROWD for b in seen)
    assert max(alone_gammas) == 4 and set(gammas) <= {0, 1}
    assert beside == alone


@pytest.mark.parametrize("seed", [None, 3])
def test_slots_price_each_round_beside_the_others_reported_rounds(seed):
    """Through the pair's slots: a greedy answer's policy sees the others' rounds (rows, tokens,
    draft depths) and drafts less; a seeded sampled one sees none; both answers are the ones
    they get alone."""
    params = (SamplingParams() if seed is None
              else SamplingParams(temperature=0.8, top_k=20, seed=seed))
    config = GenerationConfig(params=params, gamma=4, max_tokens=30)

    def answer(pair: Pair, prompt: str, seen: list) -> tuple[int, ...]:
        policy = BatchShy()
        done = [ev for ev in pair.generate(prompt, config, drafter="draft", raw=True,
                                           policy=policy) if isinstance(ev, DoneEvent)]
        seen.extend(policy.seen)
        return done[0].tokens

    alone_pair = Pair(FakeBackend(seed=0, n_seq=1), FakeBackend(seed=0, noise=0.5, n_seq=1))
    alone = [answer(alone_pair, p, []) for p, _ in PROMPTS]
    pair = Pair(FakeBackend(seed=0), FakeBackend(seed=0, noise=0.5), parallel=4)
    got: list = [None] * len(PROMPTS)
    seen: list[Batch] = []

    def go(i: int) -> None:
        got[i] = answer(pair, PROMPTS[i][0], seen)

    assert pair.slots is not None
    join_in_turn(pair.slots.step, [partial(go, i) for i in range(len(PROMPTS))])
    assert got == alone
    crowded = [b for b in seen if not b.alone]
    if seed is None:
        assert max(b.sequences for b in crowded) >= len(PROMPTS)
        assert any(b.other_drafts for b in crowded)
    else:
        assert not crowded
