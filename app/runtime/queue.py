"""The one generation queue: one generation runs on the pair at a time, up to `max_waiting`
more wait in arrival order, and any more are refused at once (the API answers 503).

It is the one lock of generations: the pair takes none of its own (engine/pair.py), and the
page's events are not limited by Gradio. The API and the Gradio app take their turns from the
same queue, so the 503 count and the order are right whoever sent the request; the holder
takes a turn too to replace or close the pair, so no generation runs on a closed one. Waiting is done in short timed steps so an async
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
    def __init__(self, max_waiting: int | None = None) -> None:
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.max_waiting = max_waiting
        self._cond = threading.Condition()
        self._waiting: deque[int] = deque()
        self._running: int | None = None
        self._ids = itertools.count(1)
        self._started = 0.0
        # How long the last generation held the slot: the basis of the Retry-After hint.
        self._last_hold_s = 0.0

    def join(self, always: bool = False) -> int:
        """A ticket: the slot at once when it is free, else a waiting place; QueueFullError when
        every place is taken, unless `always` (the holder replacing or closing the pair waits
        its turn like a generation, and is never refused)."""
        with self._cond:
            if (not always and self.max_waiting is not None and self._running is not None
                    and len(self._waiting) >= self.max_waiting):
                ahead = 1 + len(self._waiting)
                hint = math.ceil(max(self._last_hold_s, self._running_s()) * ahead)
                raise QueueFullError(
                    f"the server is busy: one generation running and {len(self._waiting)} "
                    f"waiting (--max-queue {self.max_waiting}); retry later",
                    retry_after=min(max(hint, MIN_RETRY_S), MAX_RETRY_S))
            ticket = next(self._ids)
            self._waiting.append(ticket)
            self._promote()
            return ticket

    def wait(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until `ticket` holds the slot (True) or `timeout` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == ticket, timeout)

    def leave(self, ticket: int) -> None:
        """Give the slot back, or the waiting place; either way the next in line moves up."""
        with self._cond:
            if self._running == ticket:
                self._last_hold_s = self._running_s()
                self._running = None
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
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

    def snapshot(self) -> dict:
        with self._cond:
            return {"running": self._running is not None, "waiting": len(self._waiting),
                    "max_waiting": self.max_waiting}

    def _running_s(self) -> float:
        return time.monotonic() - self._started if self._running is not None else 0.0

    def _promote(self) -> None:
        if self._running is None and self._waiting:
            self._running = self._waiting.popleft()
            self._started = time.monotonic()
            self._cond.notify_all()
