"""The generation queue: one runs, `max_waiting` wait in arrival order, the rest are refused."""
from __future__ import annotations

import threading

import pytest

from app.runtime.queue import GenerationQueue, QueueFullError


def test_one_runs_the_next_waits_and_more_are_refused():
    queue = GenerationQueue(max_waiting=1)
    first = queue.join()
    assert queue.wait(first, 0)
    second = queue.join()
    assert not queue.wait(second, 0.01)
    with pytest.raises(QueueFullError) as info:
        queue.join()
    assert 1 <= info.value.retry_after <= 60 and "--max-queue 1" in str(info.value)
    assert queue.snapshot() == {"running": True, "waiting": 1, "max_waiting": 1}
    queue.leave(first)
    assert queue.wait(second, 0)
    assert queue.snapshot() == {"running": True, "waiting": 0, "max_waiting": 1}
    queue.leave(second)
    assert queue.snapshot()["running"] is False


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
