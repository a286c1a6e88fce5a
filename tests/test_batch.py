"""Several generations decoded together (engine/slots.py, engine/batch_step.py) on fakes: each
answer is the one it gets alone with the same seed, the models' calls hold every running
sequence, a closed stream frees its slot at once, and a short answer started after a long one
ends first."""
from __future__ import annotations

import threading
import time
from functools import partial

import pytest

from bench.fakes.backend import FakeBackend
from engine.control.registry import make_policy
from engine.events import DoneEvent, TokenEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams

PROMPTS = [("hello world", 1), ("another prompt here", 2), ("abc abc abc abc", 3), ("xyz", 4)]


def config(seed: int, max_tokens: int = 40) -> GenerationConfig:
    return GenerationConfig(params=SamplingParams(temperature=0.8, top_k=20, seed=seed), gamma=4,
                            max_tokens=max_tokens)


def answer(pair: Pair, prompt: str, seed: int, drafter: str) -> tuple[int, ...]:
    policy = None if drafter == "plain" else make_policy("fixed", 4)
    done = [ev for ev in pair.generate(prompt, config(seed), drafter=drafter, raw=True,
                                       policy=policy) if isinstance(ev, DoneEvent)]
    return done[0].tokens


def batched(drafter: str) -> tuple[list, FakeBackend, FakeBackend]:
    target, draft = FakeBackend(seed=0), FakeBackend(seed=0, noise=0.5)
    pair = Pair(target, draft, parallel=4)
    got: list = [None] * len(PROMPTS)

    def run(i: int) -> None:
        got[i] = answer(pair, *PROMPTS[i], drafter)

    assert pair.slots is not None
    join_in_turn(pair.slots.step, [partial(run, i) for i in range(len(PROMPTS))])
    return got, target, draft


@pytest.mark.parametrize("drafter", ["draft", "hybrid", "lookup", "plain"])
def test_each_answer_is_the_one_it_gets_alone_with_the_same_seed(drafter):
    alone_pair = Pair(FakeBackend(seed=0, n_seq=1), FakeBackend(seed=0, noise=0.5, n_seq=1))
    alone = [answer(alone_pair, p, s, drafter) for p, s in PROMPTS]
    got, target, draft = batched(drafter)
    assert got == alone
    # The target's calls held every sequence at once (sequence 0 is the pair's own).
    assert max(len(b) for b in target.batches) == len(PROMPTS)
    assert all(seq >= 1 for b in target.batches for seq, _ in b)
    if drafter == "draft":
        # The draft decoded one batch per depth for the sequences drafting, and the target
        # verified several sequences' drafts in one call.
        assert max(len(b) for b in draft.batches) >= 3
        assert any(sum(n > 1 for _, n in b) >= 2 for b in target.batches)


class Gated(FakeBackend):
    """Holds its fourth call and later ones until `gate` is set: the generation is still
    running whatever the threads' pace."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.gate = threading.Event()

    def decode_batch(self, parts):
        if len(self.batches) >= 3:
            self.gate.wait()
        return super().decode_batch(parts)


def test_a_closed_stream_frees_its_slot_and_its_cache_at_once():
    target, draft = Gated(seed=0), FakeBackend(seed=0, noise=0.5)
    pair = Pair(target, draft, parallel=2)
    events = pair.generate("hello", config(1, max_tokens=200), drafter="draft", raw=True,
                           policy=make_policy("fixed", 4))
    first = next(ev for ev in events if isinstance(ev, TokenEvent))
    assert first.index == 0 and pair.slots is not None and pair.slots.busy == 1
    assert pair.slots.step.sequences == 1
    events.close()
    target.gate.set()
    # Waits for the generation to finish the step it was in (pair.close does the same).
    pair.slots.close()
    assert pair.slots.busy == 0 and pair.slots.step.sequences == 0
    assert len(target.batches) < 10
    assert all(c == [] for c in target.caches[1:]) and all(c == [] for c in draft.caches[1:])
    # The slot serves the next request.
    assert answer(pair, "hello", 1, "draft")


def join_in_turn(step, runs) -> None:
    """Run each of `runs` in a thread of its own, each joining the batch after the one before
    (a sequence of the test's own holds the steps meanwhile), then wait for all."""
    threads = []
    with step.sequence():
        for run in runs:
            threads.append(threading.Thread(target=run))
            threads[-1].start()
            while step.sequences <= len(threads):
                time.sleep(0.001)
    for t in threads:
        t.join()


def last_calls(target: FakeBackend, prompts: tuple[str, ...]) -> dict[str, int]:
    """The last target call each prompt's sequence took part in (its cache keeps its text):
    the batch's own order, not the wall clock's."""
    seq = {text: next(k for k, c in enumerate(target.caches)
                      if c[:len(text)] == target.tokenize(text)) for text in prompts}
    # They ran together: some call held both.
    assert any({s for s, _ in b} == set(seq.values()) for b in target.batches)
    return {text: max(i for i, b in enumerate(target.batches) if any(s == k for s, _ in b))
            for text, k in seq.items()}


def test_a_short_answer_started_after_a_long_one_ends_first():
    target, draft = FakeBackend(seed=0), FakeBackend(seed=0, noise=0.5)
    pair = Pair(target, draft, parallel=2)
    assert pair.slots is not None
    got: dict = {}

    def run(prompt: str, max_tokens: int):
        def answer() -> None:
            got[prompt] = list(pair.generate(prompt, config(7, max_tokens), drafter="draft",
                                             raw=True, policy=make_policy("fixed", 4)))
        return answer

    join_in_turn(pair.slots.step, [run("the long one", 300), run("short", 8)])
    assert got["the long one"][-1].tokens and got["short"][-1].tokens
    last = last_calls(target, ("the long one", "short"))
    assert last["short"] < last["the long one"]


def test_slots_need_a_sequence_each_and_one_for_the_pair():
    with pytest.raises(ValueError, match="need 3"):
        Pair(FakeBackend(seed=0, n_seq=2), parallel=2)


def test_a_drafter_added_with_a_maker_per_slot_runs_in_the_slots_and_one_without_is_refused():
    from engine.drafters.early_exit import early_exit_drafter
    from engine.errors import SettingsError

    own = FakeBackend(seed=0, noise=0.3)
    pair = Pair(FakeBackend(seed=0), parallel=2)
    pair.add_drafter("early-exit", early_exit_drafter(own), backend=own,
                     per_slot=lambda seq: early_exit_drafter(seq))
    alone_pair = Pair(FakeBackend(seed=0, n_seq=1))
    alone_own = FakeBackend(seed=0, noise=0.3, n_seq=1)
    alone_pair.add_drafter("early-exit", early_exit_drafter(alone_own), backend=alone_own)
    assert answer(pair, "hello world", 3, "early-exit") == answer(alone_pair, "hello world", 3,
                                                                  "early-exit")
    # The slots' drafts went to the drafter's own model, on the slots' sequences.
    assert own.batches and all(seq >= 1 for b in own.batches for seq, _ in b)
    pair.add_drafter("one-at-a-time", early_exit_drafter(FakeBackend(seed=0, noise=0.3)))
    with pytest.raises(SettingsError, match="runs one generation at a time"):
        answer(pair, "hello", 1, "one-at-a-time")


def test_a_failing_part_fails_only_its_own_sequence():
    from engine.batch_step import BatchStep
    from engine.seq_backend import SeqBackend

    class Refusing(FakeBackend):
        """Refuses any batch holding token 13, as llama.cpp refuses a bad input."""

        def decode_batch(self, parts):
            if any(13 in p.tokens for p in parts):
                raise RuntimeError("bad token")
            return super().decode_batch(parts)

    backend, step = Refusing(seed=0), BatchStep()
    got: dict = {}
    start = threading.Barrier(2)

    def run(seq: int, tokens: list[int]) -> None:
        with step.sequence():
            start.wait()
            try:
                got[seq] = SeqBackend(backend, seq, step).decode(tokens, 0, [len(tokens) - 1])
            except RuntimeError as exc:
                got[seq] = exc

    threads = [threading.Thread(target=run, args=a) for a in ((1, [5, 6]), (2, [7, 13]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(got[2], RuntimeError) and got[1].shape == (1, backend.n_vocab)
    assert backend.caches[1] == [5, 6] and backend.caches[2] == []
    # The shared call failed; seq 1 was then decoded alone.
    assert backend.batches == [((1, 2),)]


def test_a_plain_sequence_verifies_in_one_call_with_a_drafting_one():
    """Without the target's parts waiting for the draft's, the plain sequence would verify
    alone at each of the other's draft depths (rounds of different phases never meet)."""
    target, draft = FakeBackend(seed=0), FakeBackend(seed=0, noise=0.5)
    pair = Pair(target, draft, parallel=2)
    assert pair.slots is not None

    def run(prompt: str, drafter: str):
        def go() -> None:
            list(pair.generate(prompt, config(3, 30), drafter=drafter, raw=True,
                               policy=None if drafter == "plain" else make_policy("fixed", 3)))
        return go

    join_in_turn(pair.slots.step, [run("drafting one", "draft"), run("plain one", "plain")])
    last = last_calls(target, ("drafting one", "plain one"))
    both = target.batches[:min(last.values()) + 1]
    assert len(both) > 3 and all(len(b) == 2 for b in both)
    assert max(len(b) for b in draft.batches) == 1
