"""Admission with slots: the queue runs up to `parallel` generations at once (the loaded pair's
slots), more wait, more still are refused; through the API, concurrent requests share the
model's calls and each gets the answer it gets alone; a short request that arrives while a long
one streams ends first."""
from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue, QueueFullError
from app.serve.server import create_app
from bench.fakes.backend import FakeBackend
from engine.pair import Pair
from tests.serve_fakes import AUTH, N_CTX, serve_access

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


def client(parallel: int) -> tuple[TestClient, FakeBackend]:
    target = FakeBackend(seed=1, n_ctx=N_CTX, n_seq=parallel + 1)
    pair = Pair(target, FakeBackend(seed=1, noise=0.5, n_ctx=N_CTX, n_seq=parallel + 1),
                parallel=parallel)
    queue = GenerationQueue(4)
    app = create_app(PairHolder(pair, queue=queue), queue, serve_access(None))
    return TestClient(app, headers=AUTH), target


def complete(c: TestClient, prompt: str, seed: int, max_tokens: int = 24) -> str:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                         "seed": seed, **SAMPLED})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_concurrent_requests_share_the_calls_and_each_gets_its_answer_alone():
    prompts = [("first prompt", 1), ("the second one", 2), ("third", 3)]
    serial, _ = client(1)
    alone = [complete(serial, p, s) for p, s in prompts]
    c, target = client(3)
    got: list = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        start.wait()
        got[i] = complete(c, *prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone
    assert max(len(b) for b in target.batches) >= 2


def test_a_short_request_arriving_while_a_long_one_streams_ends_first():
    c, target = client(2)
    body = {"prompt": "the long one", "max_tokens": 200, "stream": True, "seed": 5, **SAMPLED}
    with c.stream("POST", "/v1/completions", json=body) as long:
        lines = long.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert complete(c, "short", 6, max_tokens=6)
        rest = list(lines)
    assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
    seq = {text: next(k for k, cache in enumerate(target.caches)
                      if cache[:len(text)] == target.tokenize(text))
           for text in ("the long one", "short")}
    last = {text: max(i for i, b in enumerate(target.batches) if any(s == k for s, _ in b))
            for text, k in seq.items()}
    assert last["short"] < last["the long one"]
