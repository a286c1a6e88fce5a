"""A draft gone stale during generation: acceptance well below what tuning measured, over a long
enough stretch, said once as an event the CLI and app format (they suggest `tandem tune`).

The rule, checked after every round that drafted: over the most recent drafted tokens (at least
WINDOW_TOKENS of them, whole rounds), the acceptance rate a_w is compared with the reference a_r
(the lowest acceptance tuning measured for this configuration in any prompt category, so a
prompt of a harder kind than the average is not mistaken for a stale draft). It fires when

    a_w < a_r - max(MIN_GAP, Z * sqrt(a_r (1 - a_r) * DESIGN_EFFECT / n))

with n the window's drafted tokens. The binomial standard error is inflated by DESIGN_EFFECT
because drafted tokens are not independent draws (a rejection ends its round, and hard passages
come in runs); Z = 3 keeps the chance of a false alarm small although the test is repeated after
every round; MIN_GAP makes "well below" mean at least 15 points, whatever the window.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Generator, Iterator

from engine.events import Event, RoundEvent
from engine.stats import RoundStats

WINDOW_TOKENS = 128
MIN_GAP = 0.15
Z = 3.0
DESIGN_EFFECT = 3.0


@dataclass(frozen=True)
class StaleDraftEvent:
    """Acceptance over the last `drafted` drafted tokens fell to `observed`, below `threshold`
    (the reference `expected` minus the margin), at round `round`."""
    expected: float
    observed: float
    threshold: float
    drafted: int
    round: int


def threshold(expected: float, n: int) -> float:
    """The acceptance below which a window of `n` drafted tokens counts as stale."""
    sd = math.sqrt(max(expected * (1.0 - expected), 0.0) * DESIGN_EFFECT / max(n, 1))
    return expected - max(MIN_GAP, Z * sd)


class AcceptanceWatch:
    def __init__(self, expected: float, window: int = WINDOW_TOKENS) -> None:
        self.expected = expected
        self.window = window
        self.fired = False
        self._rounds: deque[tuple[int, int]] = deque()
        # Running totals of the window, so a round costs O(1) instead of re-summing the deque.
        self._drafted = 0
        self._accepted = 0

    def update(self, r: RoundStats) -> StaleDraftEvent | None:
        """Feed one round; the event the first time the window falls below the threshold."""
        if self.fired or r.drafted == 0:
            return None
        self._rounds.append((r.drafted, r.accepted))
        self._drafted += r.drafted
        self._accepted += r.accepted
        # Keep the fewest recent whole rounds that still hold `window` drafted tokens.
        while self._rounds and self._drafted - self._rounds[0][0] >= self.window:
            d, a = self._rounds.popleft()
            self._drafted -= d
            self._accepted -= a
        n = self._drafted
        if n < self.window:
            return None
        observed = self._accepted / n
        limit = threshold(self.expected, n)
        if observed >= limit:
            return None
        self.fired = True
        return StaleDraftEvent(self.expected, observed, limit, n, r.index)


def watch(events: Generator[Event, None, None], expected: float | None,
          window: int = WINDOW_TOKENS) -> Iterator[Event | StaleDraftEvent]:
    """Pass `events` through, adding one StaleDraftEvent after the round that trips the watch;
    `expected` None watches nothing. Closing this closes `events` (a pair's generation holds its
    lock until closed)."""
    w = AcceptanceWatch(expected, window) if expected is not None else None
    try:
        for ev in events:
            yield ev
            if w is not None and isinstance(ev, RoundEvent):
                stale = w.update(ev.round)
                if stale is not None:
                    yield stale
    finally:
        events.close()
