"""Admission with slots: the queue runs up to `parallel` generations at once (the loaded pair's
slots), more wait, more still are refused; through the API, concurrent requests share the
model's calls and each gets the answer it gets alone; a short request that arrives while a long
one streams ends first."""
from __future__ import annotations


import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue, QueueFullError
from app.serve.server import create_app
from bench.fakes.backend import FakeBackend
from engine.pair import Pair
from tests.serve_fakes import AUTH, N_CTX, serve_access
from tests.test_batch import join_in_turn, last_calls

SAMPLED = {"speculative": {"drafter": "draft", "policy": "fixed", "gamma": 3},
           "temperature": 0.8, "top_k": 20}


def test_parallel_places_run_at_once_then_they_wait_then_they_are_refused():
    queue = GenerationQueue(max_waiting=1, parallel=2)
    a, b = queue.join(), queue.join()
    assert queue.wait(a, 0) and queue.wait(b, 0)
    c = queue.join()
    assert not queue.wait(c, 0)
    with pytest.raises(QueueFullError, match="2 generations running and 1 waiting"):
        queue.join()
    queue.leave(a)
    assert queue.wait(c, 0)
    assert queue.snapshot() == {"running": 2, "waiting": 0, "max_waiting": 1, "parallel": 2}


def test_an_exclusive_turn_waits_for_every_running_one_and_nobody_passes_it():
    queue = GenerationQueue(parallel=3)
    a = queue.join()
    assert queue.wait(a, 0)
    alone = queue.join(always=True)
    later = queue.join()
    assert not queue.wait(alone, 0) and not queue.wait(later, 0)
    queue.leave(a)
    assert queue.wait(alone, 0) and not queue.wait(later, 0)
    queue.leave(alone)
    assert queue.wait(later, 0)


def test_the_holder_admits_as_many_as_the_pair_has_slots():
    holder = PairHolder(Pair(FakeBackend(seed=1), parallel=3), queue=GenerationQueue(2))
    assert holder.queue.parallel == 3
    holder.replace(Pair(FakeBackend(seed=1, n_seq=1)))
    assert holder.queue.parallel == 1


def client(parallel: int) -> tuple[TestClient, Pair, FakeBackend]:
    target = FakeBackend(seed=1, n_ctx=N_CTX, n_seq=parallel + 1)
    pair = Pair(target, FakeBackend(seed=1, noise=0.5, n_ctx=N_CTX, n_seq=parallel + 1),
                parallel=parallel)
    queue = GenerationQueue(4)
    app = create_app(PairHolder(pair, queue=queue), queue, serve_access(None))
    return TestClient(app, headers=AUTH), pair, target


def complete(c: TestClient, prompt: str, seed: int, max_tokens: int = 24) -> str:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                         "seed": seed, **SAMPLED})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_concurrent_requests_share_the_calls_and_each_gets_its_answer_alone():
    prompts = [("first prompt", 1), ("the second one", 2), ("third", 3)]
    serial, _, _ = client(1)
    alone = [complete(serial, p, s) for p, s in prompts]
    c, pair, target = client(3)
    got: list = [None] * len(prompts)

    def run(i: int):
        def ask() -> None:
            got[i] = complete(c, *prompts[i])
        return ask

    assert pair.slots is not None
    join_in_turn(pair.slots.step, [run(i) for i in range(len(prompts))])
    assert got == alone
    assert max(len(b) for b in target.batches) == len(prompts)


def test_a_short_request_arriving_while_a_long_one_streams_ends_first():
    c, pair, target = client(2)
    body = {"prompt": "the long one", "max_tokens": 200, "stream": True, "seed": 5, **SAMPLED}
    lines: list[str] = []

    def long() -> None:
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines.extend(r.iter_lines())

    def short() -> None:
        assert complete(c, "short", 6, max_tokens=6)

    assert pair.slots is not None
    join_in_turn(pair.slots.step, [long, short])
    assert "data: [DONE]" in lines
    last = last_calls(target, ("the long one", "short"))
    assert last["short"] < last["the long one"]
