"""The suffix drafter's history in the overhead runs: Zipf text held frozen (the runs time a
round's lookup, not the index growing), and the timing of its lookups and of adding an answer."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.drafters.history_index import HistoryIndex
from engine.drafters.suffix import MIN_SHARE


class FrozenHistory(HistoryIndex):
    """A history that keeps what it holds: the overhead runs time a round's lookup, not the
    index growing by each answer (`HistoryTiming.add_ms` measures that)."""

    def add(self, document: Sequence[int]) -> None:
        pass


def zipf_history(n_tokens: int, n_vocab: int, seed: int = 2, doc: int = 2_000) -> HistoryIndex:
    """`n_tokens` tokens of Zipf(1.2)-distributed ids in documents of `doc` tokens: frequent ids
    repeat as in text, so a lookup finds many matches to compare."""
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.2, size=n_tokens) - 1) % n_vocab
    index = FrozenHistory(capacity=2 * n_tokens + 1_000)
    starts = np.arange(0, n_tokens, doc)
    index._load_documents([ids[s:s + doc] for s in starts], np.arange(len(starts)), len(starts))
    return index


@dataclass(frozen=True)
class HistoryTiming:
    tokens: int
    lookups: int
    found: float  # share of lookups that matched
    median_ms: float
    p90_ms: float
    add_ms: float  # adding a 512-token document (after a generation)


def time_history(history: HistoryIndex, n_vocab: int, lookups: int = 400,
                 seed: int = 3) -> HistoryTiming:
    """A round's lookup (`match`, 8 tokens wanted) after contexts that are Zipf text like the
    history's; then the time to add one 512-token document to it."""
    rng = np.random.default_rng(seed)
    held = history.n_tokens
    times, found = [], 0
    for _ in range(lookups):
        context = ((rng.zipf(1.2, size=64) - 1) % n_vocab).tolist()
        t0 = time.perf_counter()
        found += len(history.match(context, 8, MIN_SHARE)) > 0
        times.append(time.perf_counter() - t0)
    doc = (rng.zipf(1.2, size=512) - 1) % n_vocab
    t0 = time.perf_counter()
    # The base class's add, which FrozenHistory skips: last, after every lookup was timed.
    HistoryIndex.add(history, doc.tolist())
    add_ms = (time.perf_counter() - t0) * 1e3
    ms = np.array(times) * 1e3
    return HistoryTiming(held, lookups, found / lookups, float(np.median(ms)),
                         float(np.percentile(ms, 90)), add_ms)
