"""The one generation queue, admission to the pair: up to `parallel` generations run at once
(the pair's slots, decoded in shared batches: engine/slots.py), up to `max_waiting` more wait
in arrival order, and any more are refused at once (the API answers 503 with Retry-After).

It is the one lock of generations: the pair takes none of its own (engine/pair.py), and the
page's events are not limited by Gradio. The API and the Gradio app take their turns from the
same queue, so the 503 count and the order are right whoever sent the request; the holder
takes a turn too to replace or close the pair (`always`: it waits for every running generation
and runs alone), so no generation runs on a closed one. Waiting is done in short timed steps so an async
caller can give up (its client disconnected) between steps.
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Iterator

from engine.errors import TandemError

# Retry-After bounds, in seconds: a hint, never a promise.
MIN_RETRY_S, MAX_RETRY_S = 1, 60


class QueueFullError(TandemError):
    """Every waiting place is taken; `retry_after` is the seconds to wait before retrying."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GenerationQueue:
    def __init__(self, max_waiting: int | None = None, parallel: int = 1) -> None:
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        self.max_waiting = max_waiting
        self.parallel = parallel
        self._cond = threading.Condition()
        self._waiting: deque[int] = deque()
        # Running tickets, by when each started; an exclusive one runs alone.
        self._running: dict[int, float] = {}
        self._exclusive: set[int] = set()
        self._ids = itertools.count(1)
        # How long the last generation held the slot: the basis of the Retry-After hint.
        self._last_hold_s = 0.0

    def join(self, always: bool = False) -> int:
        """A ticket: the slot at once when it is free, else a waiting place; QueueFullError when
        every place is taken, unless `always` (the holder replacing or closing the pair waits
        its turn like a generation, and is never refused)."""
        with self._cond:
            if (not always and self.max_waiting is not None
                    and len(self._running) >= self.parallel
                    and len(self._waiting) >= self.max_waiting):
                # Each running place frees in about one hold; the waiting ones share them.
                rounds = 1 + len(self._waiting) // self.parallel
                hint = math.ceil(max(self._last_hold_s, self._running_s()) * rounds)
                raise QueueFullError(
                    f"the server is busy: {len(self._running)} generations running and "
                    f"{len(self._waiting)} waiting (--max-queue {self.max_waiting}); retry later",
                    retry_after=min(max(hint, MIN_RETRY_S), MAX_RETRY_S))
            ticket = next(self._ids)
            if always:
                self._exclusive.add(ticket)
            self._waiting.append(ticket)
            self._promote()
            return ticket

    def wait(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until `ticket` holds the slot (True) or `timeout` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: ticket in self._running, timeout)

    def leave(self, ticket: int) -> None:
        """Give the slot back, or the waiting place; either way the next in line moves up."""
        with self._cond:
            started = self._running.pop(ticket, None)
            if started is not None:
                self._last_hold_s = time.monotonic() - started
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._exclusive.discard(ticket)
            self._promote()

    @contextmanager
    def slot(self, always: bool = False) -> Iterator[None]:
        """Hold the slot for the body (blocking until it is this caller's turn)."""
        ticket = self.join(always)
        try:
            self.wait(ticket)
            yield
        finally:
            self.leave(ticket)

    def set_parallel(self, parallel: int) -> None:
        """Admit `parallel` at once from now on: the slots of the pair just loaded."""
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        with self._cond:
            self.parallel = parallel
            self._promote()

    def snapshot(self) -> dict:
        with self._cond:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "max_waiting": self.max_waiting, "parallel": self.parallel}

    def _running_s(self) -> float:
        """How long the oldest running generation has run."""
        return time.monotonic() - min(self._running.values()) if self._running else 0.0

    def _promote(self) -> None:
        """Start the waiting in arrival order while there is room: a place each, and an
        exclusive turn once nothing runs (nobody passes it meanwhile)."""
        while self._waiting and not self._exclusive.intersection(self._running):
            head = self._waiting[0]
            room = (not self._running if head in self._exclusive
                    else len(self._running) < self.parallel)
            if not room:
                break
            self._running[self._waiting.popleft()] = time.monotonic()
            self._cond.notify_all()
