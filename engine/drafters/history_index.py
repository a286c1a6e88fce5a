"""The history index: the token ids of past prompts and answers (of one tokenizer), searched for
the longest match of a context's suffix, with what followed each match and how often (suffix
decoding, arXiv 2411.04975, as a sorted array instead of a tree).

Layout. `tokens` holds every document end to end, each followed by SEP (-1), so no match and no
continuation crosses into another document. Every position i whose 2-gram tokens[i-1:i+1] holds
no SEP is indexed under a 64-bit key: the 2-gram in the top 36 bits (exact for ids below 2^18,
Qwen2.5's 151,936 included) and a 28-bit hash of the two tokens before it below. Sorted by key,
the positions ending one 2-gram are one run, and inside it those ending one 4-gram one sub-run.
A lookup finds the run by binary search (microseconds at 10 million tokens), takes its most
recent `CANDIDATES` positions, counts each one's real match length token by token (so a hash
collision only wastes a candidate), keeps the longest, and walks their continuations: at each
step the most frequent next token and its share, which is the suffix tree's child frequency.

Documents are evicted least recently used (added, or drafted from and accepted) once the index
holds more than `capacity` tokens. The index changes only through `add` and `evict`; a lookup
reads it, so a generation that adds only when it ends drafts from the index as it began.

    >>> h = HistoryIndex()
    >>> h.add([5, 6, 7, 8, 9])
    >>> m = h.match([1, 6, 7], 4)
    >>> m.tokens, m.length
    ([8, 9], 2)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

SEP = -1
# How many occurrences of the matched n-gram a lookup compares (the most recent ones), and how far
# back it counts a match: enough to tell a repeated request from a shared phrase, and as far as
# the longest copy (engine/generation_config.py's COPY_MAX), whose evidence is kept by match
# length (engine/round_plan.py).
CANDIDATES = 64
MATCH_MAX = 64
# The shortest match worth drafting from.
MATCH_MIN = 2
_LOW_BITS = 28
_LOW_MASK = np.uint64((1 << _LOW_BITS) - 1)
_PAIR_BITS = 18
_PAIR_MASK = np.uint64((1 << 36) - 1)
_H1 = np.uint64(0x9E3779B97F4A7C15)
_H2 = np.uint64(0xC2B2AE3D27D4EB4F)


@dataclass(frozen=True)
class HistoryMatch:
    """A lookup's answer: the drafted continuation, each token's share among the matches that
    reached it (the empirical probability the drafter stops on), the match length, how many
    occurrences matched that long, and the document drafted from (for recency)."""

    tokens: list[int]
    shares: list[float]
    length: int
    occurrences: int
    document: int

    def __len__(self) -> int:
        return len(self.tokens)


NO_MATCH = HistoryMatch([], [], 0, 0, -1)


def _keys(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The sort key of each position (module docstring); every position must be >= 1."""
    a = tokens[positions - 1].astype(np.uint64)
    b = tokens[positions].astype(np.uint64)
    pair = ((a << np.uint64(_PAIR_BITS)) + b) & _PAIR_MASK
    back = positions >= 3
    c = np.where(back, tokens[np.maximum(positions - 3, 0)], SEP)
    d = np.where(back, tokens[np.maximum(positions - 2, 0)], SEP)
    ok = (c >= 0) & (d >= 0)
    with np.errstate(over="ignore"):
        h = (c.astype(np.uint64) * _H1) ^ (d.astype(np.uint64) * _H2)
    low = np.where(ok, (h >> np.uint64(64 - _LOW_BITS)) & _LOW_MASK, np.uint64(0))
    return (pair << np.uint64(_LOW_BITS)) | low


def _pair_key(a: int, b: int) -> int:
    return (((a << _PAIR_BITS) + b) & ((1 << 36) - 1)) << _LOW_BITS


_M64 = (1 << 64) - 1


def _key4(c: int, d: int, a: int, b: int) -> int:
    """`_keys` of the last of four tokens c d a b, in Python ints (a lookup's one key)."""
    h = ((c * int(_H1)) & _M64) ^ ((d * int(_H2)) & _M64)
    return _pair_key(a, b) | ((h >> (64 - _LOW_BITS)) & ((1 << _LOW_BITS) - 1))


def _walk(follow: list[list[int]], where: list[int], min_share: float
          ) -> tuple[list[int], list[float], int]:
    """The suffix tree's most frequent path below a node: `follow[r]` is what came after
    occurrence r (at position `where[r]`, in position order); at each step the most frequent
    next token among the occurrences still agreeing (ties: the latest occurrence's), with its
    share of them, until the product of shares would fall below `min_share` or every agreeing
    occurrence's document ended. Returns (tokens, shares, position of the latest occurrence
    that agreed throughout). Plain Python: at most CANDIDATES rows of a few tokens."""
    alive = list(range(len(follow)))
    out: list[int] = []
    shares: list[float] = []
    chain = 1.0
    for step in range(len(follow[0]) if follow else 0):
        col = [follow[r][step] for r in alive]
        counts: dict[int, int] = {}
        for t in col:
            if t >= 0:
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            break
        top = max(counts.values())
        token = next(t for t in reversed(col) if counts.get(t) == top)
        share = top / len(col)
        if chain * share < min_share:
            break
        chain *= share
        out.append(token)
        shares.append(share)
        alive = [r for r in alive if follow[r][step] == token]
    return out, shares, where[alive[-1]] if alive else where[-1]


class HistoryIndex:
    """`capacity` tokens at most (documents and their separators), least recently used first out."""

    def __init__(self, capacity: int = 2_000_000) -> None:
        if capacity < 16:
            raise ValueError(f"history capacity must be at least 16 tokens, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self.tokens: I32 = np.zeros(0, dtype=np.int32)
        # Documents: start offsets (ascending) and the clock reading when each was last used.
        self.starts: I64 = np.zeros(0, dtype=np.int64)
        self.stamps: I64 = np.zeros(0, dtype=np.int64)
        self.clock = 0
        self._keys = np.zeros(0, dtype=np.uint64)
        self._pos: I32 = np.zeros(0, dtype=np.int32)

    # Size ---------------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens held, separators excluded."""
        return int(len(self.tokens) - len(self.starts))

    @property
    def n_documents(self) -> int:
        return int(len(self.starts))

    def clear(self) -> None:
        with self._lock:
            self._clear()

    # Writing ------------------------------------------------------------------------------

    def add(self, document: Sequence[int]) -> None:
        """Index one document (a prompt with its answer), then evict down to capacity."""
        doc = np.asarray(document, dtype=np.int64).ravel()
        if doc.size == 0:
            return
        if int(doc.min()) < 0 or int(doc.max()) >= 2**31:
            raise ValueError("token ids must be in [0, 2^31)")
        doc = doc[-(self.capacity - 1):].astype(np.int32)
        with self._lock:
            base = len(self.tokens)
            self.tokens = np.concatenate([self.tokens, doc, np.array([SEP], dtype=np.int32)])
            self.clock += 1
            self.starts = np.append(self.starts, base)
            self.stamps = np.append(self.stamps, self.clock)
            positions = np.arange(base + 1, base + len(doc), dtype=np.int64)
            keys = _keys(self.tokens, positions)
            order = np.argsort(keys, kind="stable")
            keys, positions = keys[order], positions[order]
            # Equal keys stay in position order (new positions after old), so the end of a run
            # is its most recent occurrences.
            at = np.searchsorted(self._keys, keys, side="right")
            self._keys = np.insert(self._keys, at, keys)
            self._pos = np.insert(self._pos, at, positions.astype(np.int32))
            if len(self.tokens) > self.capacity:
                self._evict_to(int(self.capacity * 0.9))

    def _evict_to(self, budget: int) -> None:
        """Keep the most recently used documents that fit in `budget` tokens (in their order)."""
        ends = np.append(self.starts[1:], len(self.tokens))
        sizes = ends - self.starts
        newest_first = np.argsort(-self.stamps, kind="stable")
        kept = newest_first[np.cumsum(sizes[newest_first]) <= budget]
        if kept.size == 0:
            kept = newest_first[:1]
        kept = np.sort(kept)
        docs = [self.tokens[self.starts[i]:ends[i] - 1] for i in kept]
        stamps = self.stamps[kept]
        clock = self.clock
        self._clear()
        self._load_documents(docs, stamps, clock)

    def _load_documents(self, docs: Sequence[np.ndarray], stamps: I64, clock: int) -> None:
        """Rebuild from documents (in order) and their stamps; the lock is held or not needed."""
        pieces, starts, at = [], [], 0
        for d in docs:
            starts.append(at)
            pieces.append(np.asarray(d, dtype=np.int32))
            pieces.append(np.array([SEP], dtype=np.int32))
            at += len(d) + 1
        self.tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        self.starts = np.array(starts, dtype=np.int64)
        self.stamps = np.asarray(stamps, dtype=np.int64).copy()
        self.clock = int(clock)
        t = self.tokens
        if len(t) < 2:
            return
        positions = np.flatnonzero((t[1:] >= 0) & (t[:-1] >= 0)).astype(np.int64) + 1
        keys = _keys(t, positions)
        order = np.argsort(keys, kind="stable")
        self._keys, self._pos = keys[order], positions[order].astype(np.int32)

    def touch(self, document: int) -> None:
        """Document `document` was drafted from and accepted: it is the last to be evicted."""
        with self._lock:
            if 0 <= document < len(self.stamps):
                self.clock += 1
                self.stamps[document] = self.clock

    # State, for the store -----------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        """What `restore` rebuilds the index from: the documents and their recency."""
        with self._lock:
            return {"tokens": self.tokens.copy(), "starts": self.starts.copy(),
                    "stamps": self.stamps.copy(), "clock": np.array([self.clock], dtype=np.int64)}

    @classmethod
    def restore(cls, state: dict[str, np.ndarray], capacity: int) -> "HistoryIndex":
        """The index `state` describes, evicted down to `capacity`; a malformed state is a
        ValueError."""
        tokens = np.asarray(state["tokens"], dtype=np.int64)
        starts = np.asarray(state["starts"], dtype=np.int64)
        stamps = np.asarray(state["stamps"], dtype=np.int64)
        if len(starts) != len(stamps) or (len(starts) and (starts[0] != 0 or np.any(np.diff(starts) < 2))):
            raise ValueError("the history's document table is inconsistent")
        ends = np.append(starts[1:], len(tokens))
        if len(starts) and (np.any(tokens[ends - 1] != SEP) or
                            np.count_nonzero(tokens == SEP) != len(starts) or tokens.min() < SEP):
            raise ValueError("the history's tokens and documents disagree")
        index = cls(capacity)
        index._load_documents([tokens[s:e - 1] for s, e in zip(starts, ends)], stamps,
                              int(np.asarray(state["clock"]).ravel()[0]))
        if len(index.tokens) > capacity:
            index._evict_to(int(capacity * 0.9))
        return index

    # Reading ------------------------------------------------------------------------------

    def match(self, context: Sequence[int], want: int, min_share: float = 0.0,
              min_length: int = MATCH_MIN) -> HistoryMatch:
        """Up to `want` tokens continuing the longest earlier match of `context`'s suffix (at least
        `min_length` tokens long), each the most frequent next token among the matches still
        agreeing, stopping before a token whose cumulative share falls below `min_share`."""
        n = len(context)
        if want < 1 or n < max(min_length, MATCH_MIN):
            return NO_MATCH
        recent = [int(t) for t in context[max(0, n - MATCH_MAX):]]
        with self._lock:
            keys, pos, tokens, starts = self._keys, self._pos, self.tokens, self.starts
        if len(keys) == 0:
            return NO_MATCH
        hi = lo = 0
        if len(recent) >= 4:
            full = _key4(*recent[-4:])
            lo, hi = keys.searchsorted(np.array([full, full + 1], dtype=np.uint64))
        if hi <= lo:
            pair = _pair_key(recent[-2], recent[-1])
            lo, hi = keys.searchsorted(np.array([pair, pair + (1 << _LOW_BITS)], dtype=np.uint64))
        if hi <= lo:
            return NO_MATCH
        cand = pos[max(lo, hi - CANDIDATES):hi]
        # Match length of each candidate: tokens[c - j] == recent[-1 - j] for j < length.
        at = cand[:, None] - np.arange(len(recent), dtype=np.int64)[None, :]
        seen = np.where(at >= 0, tokens[np.maximum(at, 0)], SEP - 1)
        same = seen == np.array(recent[::-1], dtype=np.int64)[None, :]
        lengths = np.logical_and.accumulate(same, axis=1).sum(axis=1)
        best = int(lengths.max())
        if best < max(min_length, MATCH_MIN):
            return NO_MATCH
        chosen = cand[lengths == best]
        idx = np.minimum(chosen[:, None] + np.arange(1, want + 1, dtype=np.int64)[None, :],
                         len(tokens) - 1)
        out, shares, last = _walk(tokens[idx].tolist(), chosen.tolist(), min_share)
        if not out:
            return NO_MATCH
        document = int(np.searchsorted(starts, last, side="right") - 1)
        return HistoryMatch(out, shares, best, int(len(chosen)), document)
