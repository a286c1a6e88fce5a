"""The generation queue: one runs, `max_waiting` wait in arrival order, the rest are refused."""
from __future__ import annotations

import contextlib
import threading
import time

import pytest

from app.runtime.holder import PairHolder
from app.runtime.queue import GenerationQueue, QueueFullError
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams
from bench.fakes.backend import FakeBackend


def test_one_runs_the_next_waits_and_more_are_refused():
    queue = GenerationQueue(max_waiting=1)
    first = queue.join()
    assert queue.wait(first, 0)
    second = queue.join()
    assert not queue.wait(second, 0)
    with pytest.raises(QueueFullError) as info:
        queue.join()
    assert 1 <= info.value.retry_after <= 60 and "--max-queue 1" in str(info.value)
    assert queue.snapshot() == {"running": 1, "waiting": 1, "max_waiting": 1, "parallel": 1}
    queue.leave(first)
    assert queue.wait(second, 0)
    assert queue.snapshot() == {"running": 1, "waiting": 0, "max_waiting": 1, "parallel": 1}
    queue.leave(second)
    assert queue.snapshot()["running"] == 0


def test_waiters_are_served_in_arrival_order_and_a_waiter_may_leave():
    queue = GenerationQueue()
    running = queue.join()
    tickets = [queue.join() for _ in range(3)]
    queue.leave(tickets[1])  # gave up while waiting (client disconnected)
    order: list[int] = []

    def take(ticket: int) -> None:
        queue.wait(ticket)
        order.append(ticket)
        queue.leave(ticket)

    threads = [threading.Thread(target=take, args=(t,)) for t in reversed([tickets[0], tickets[2]])]
    for t in threads:
        t.start()
    queue.leave(running)
    for t in threads:
        t.join(5)
    assert order == [tickets[0], tickets[2]]


def test_no_waiting_places_still_runs_one():
    queue = GenerationQueue(max_waiting=0)
    with queue.slot(), pytest.raises(QueueFullError):
        queue.join()
    with queue.slot():
        pass


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError):
        GenerationQueue(-1)


class Overlap(FakeBackend):
    """A backend that notices two decodes at once (what a second generation on the same llama.cpp
    context would do) and sleeps in each, so that overlapping callers would meet."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.busy = threading.Lock()
        self.overlaps = 0

    def decode(self, tokens, pos, rows):
        if not self.busy.acquire(blocking=False):
            self.overlaps += 1
            self.busy.acquire()
        try:
            time.sleep(0.002)
            return super().decode(tokens, pos, rows)
        finally:
            self.busy.release()


def test_the_queue_is_the_one_lock_generations_take():
    target = Overlap(eog=59)
    holder = PairHolder(Pair(target, FakeBackend(eog=59, noise=1.0)),
                        queue=GenerationQueue(max_waiting=8))
    config = GenerationConfig(params=SamplingParams(), gamma=3, max_tokens=12)
    texts: list[str] = []

    def answer(i: int) -> None:
        with holder.queue.slot():
            done = [e for e in holder.pair.generate(f"prompt {i}", config) if isinstance(e, DoneEvent)]
            texts.append(done[0].text)

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Four generations on one pair, none interleaved with another, and the pair has no lock of
    # its own to take.
    assert len(texts) == 4 and target.overlaps == 0
    assert not hasattr(holder.pair, "lock")


def _pair_once_the_replacer_queued(holder: PairHolder) -> tuple[Pair, Pair, threading.Thread, int]:
    """With a generation's ticket held, start `holder.replace` in a thread; once that thread
    either waits in the queue or has replaced the pair, return (the pair before, the pair then,
    the thread, the generation's ticket). Polls the queue's state, not the clock (the bound only guards a hang)."""
    old = holder.pair
    ticket = holder.queue.join()
    swapped = threading.Event()

    def replace() -> None:
        holder.replace(Pair(FakeBackend(eog=59)))
        swapped.set()

    t = threading.Thread(target=replace)
    t.start()
    for _ in range(60_000):
        if swapped.is_set() or holder.queue.snapshot()["waiting"] == 1:
            return old, holder.pair, t, ticket
        time.sleep(0.001)
    raise AssertionError("the replacer neither queued nor replaced the pair")


def test_the_holder_replaces_the_pair_only_between_generations():
    holder = PairHolder(Pair(FakeBackend(eog=59)), queue=GenerationQueue(max_waiting=0))
    old, then, t, ticket = _pair_once_the_replacer_queued(holder)
    # The replacer waits in the queue behind the running generation: by construction it cannot
    # have swapped the pair, however long it has been waiting.
    assert then is old and holder.queue.snapshot() == {"running": 1, "waiting": 1,
                                                       "max_waiting": 0, "parallel": 1}
    # Refused to no one: the holder waits its turn even when no waiting place is free.
    with pytest.raises(QueueFullError):
        holder.queue.join()
    holder.queue.leave(ticket)  # the generation ends
    t.join(60)  # only a guard against a hang
    assert not t.is_alive() and holder.pair is not old


def test_a_replace_that_skipped_the_queue_would_be_seen(monkeypatch):
    """The negative control: a holder that swaps without waiting for the slot is caught."""
    holder = PairHolder(Pair(FakeBackend(eog=59)), queue=GenerationQueue(max_waiting=0))
    monkeypatch.setattr(holder.queue, "slot", lambda always=False: contextlib.nullcontext())
    old, then, t, _ = _pair_once_the_replacer_queued(holder)
    t.join(60)
    assert then is not old
