"""Substitutions: copies that learn the edit's renames.

A whole-file edit copies its source (the prompt, or a predicted output) in long runs. A rename
breaks the copy at every later occurrence of the old name: the copy drafts the old name, the
target rejects it, and the copy has to find its place again. So the answer is aligned against
the source it copies as it is committed, token by token (`Alignment`): where the answer departs
from the source and rejoins it within a few tokens, the source span S it left out and the
answer's span A in its place are learnt as a pair S -> A (`Substitutions`); a later copy from the
source that holds S drafts A in its place and goes on copying after S.

Worked example (token ids). Source 5 1 2 3 4 6 1 2 8, the answer so far 5 7 2 3 4: the
answer follows the source at its 5, departs at 7 (the source has 1 there) and rejoins at 2 3 4
(REALIGN tokens, found at source position 2, within SPAN_MAX of where it departed). So
S = (1,), A = (7,), and the alignment follows the source at its 6. The next copy, from source
position 5, is 6 1 2 8 as it stands and drafts 6 7 2 8 (`Substitutions.rewrite`). Where the answer later writes S as it stands (it follows
the source through S), the pair is dropped; a pair learnt again for the same S replaces it, and
the most recent pair wins where two apply at one position.

Bounds: S and A each hold 1 to SPAN_MAX tokens (an insertion has no S to find, a deletion is not
learnt), at most PAIRS_MAX pairs are kept (the least recent is dropped), and an answer that has
not rejoined within SPAN_MAX + REALIGN tokens of its departure is lost until its last REALIGN
tokens occur in the source again (the drafter's `locate` says where).

Why this is exact (docs/EXACTNESS.md): the pairs are a function of the source and the committed
text alone, fed to the alignment one token at a time in order, whatever the rounds were, and a
copy with substitutions is a function of the pairs, the source and the copy's start, itself
chosen from the committed text. Nothing reads a token before it is committed, so whether drafted
token x_i is put before the target never depends on x_i; the copy carries no q and the target
verifies it with the one-hot rule, as any copy. With no pair learnt the copy is the plain one.
"""
from __future__ import annotations

from typing import Callable, Sequence

# The longest S and A learnt, in tokens.
SPAN_MAX = 8
# Tokens the answer and the source must agree on after a departure for it to count as rejoined.
REALIGN = 3
# Pairs kept, most recent first.
PAIRS_MAX = 8


class Substitutions:
    """The learnt pairs S -> A (token tuples), most recent last, and their use in a copy."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[int, ...], tuple[int, ...]] = {}
        # S by its first token, most recent last: where a rewrite looks.
        self._by_first: dict[int, list[tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def learn(self, s: tuple[int, ...], a: tuple[int, ...]) -> None:
        """Keep S -> A as the most recent pair (replacing what S had), dropping the least
        recent past PAIRS_MAX."""
        self.drop(s)
        self.pairs[s] = a
        self._by_first.setdefault(s[0], []).append(s)
        if len(self.pairs) > PAIRS_MAX:
            self.drop(next(iter(self.pairs)))

    def drop(self, s: tuple[int, ...]) -> None:
        if self.pairs.pop(s, None) is None:
            return
        firsts = self._by_first[s[0]]
        firsts.remove(s)
        if not firsts:
            del self._by_first[s[0]]

    def ending_with(self, token: int) -> list[tuple[int, ...]]:
        """The learnt S that end with `token` (few: at most PAIRS_MAX)."""
        return [s for s in self.pairs if s[-1] == token]

    def rewrite(self, source: Sequence[int], start: int, stop: int, limit: int) -> list[int]:
        """source[start:stop] with each learnt S in it replaced by its A (the most recent pair
        where several start at one position; an S must lie whole before `stop`), at most
        `limit` tokens.

        >>> subs = Substitutions(); subs.learn((1,), (7, 8))
        >>> subs.rewrite([5, 1, 2, 1, 3], 0, 5, 10), subs.rewrite([5, 1, 2, 1, 3], 0, 5, 3)
        ([5, 7, 8, 2, 7, 8, 3], [5, 7, 8])
        """
        out: list[int] = []
        by_first = self._by_first
        i = start
        while i < stop and len(out) < limit:
            t = int(source[i])
            candidates = by_first.get(t)
            if candidates:
                for s in reversed(candidates):
                    n = len(s)
                    if i + n <= stop and tuple(int(x) for x in source[i:i + n]) == s:
                        out.extend(self.pairs[s])
                        i += n
                        break
                else:
                    out.append(t)
                    i += 1
            else:
                out.append(t)
                i += 1
        return out[:limit]


# Where the alignment stands.
_LOST, _ALIGNED, _DEPARTED = 0, 1, 2


class Alignment:
    """The answer (`text[begin:]`, as it grows) aligned against `source`, learning into
    `substitutions`. `locate(i)` is the drafter's: the source position the answer follows after
    its token i (the one after an occurrence of the REALIGN tokens ending at i), or -1; it is
    asked only while the answer is lost. `source` may be `text` itself (prompt lookup copies
    from the context), as long as every position it gives is before the answer's next token."""

    def __init__(self, source: Sequence[int], text: Sequence[int], begin: int,
                 locate: Callable[[int], int]) -> None:
        self.source = source
        self.text = text
        self.substitutions = Substitutions()
        self._locate = locate
        self._fed = begin
        self._begin = begin
        self._state = _LOST
        # Aligned: the source position of the answer's next token, and how many tokens the
        # answer has followed since it aligned. Departed: where, in the source and the text.
        self._at = 0
        self._run = 0
        self._left = 0
        self._departed = 0

    def update(self) -> None:
        """Feed the tokens committed since the last call, in order."""
        text = self.text
        for i in range(self._fed, len(text)):
            self._feed(i, int(text[i]))
        self._fed = max(self._fed, len(text))

    def _feed(self, i: int, token: int) -> None:
        source = self.source
        if self._state == _ALIGNED:
            at = self._at
            if at < len(source) and int(source[at]) == token:
                self._at, self._run = at + 1, self._run + 1
                subs = self.substitutions
                if subs.pairs:
                    # The answer wrote a learnt S as it stands: the pair no longer holds.
                    for s in subs.ending_with(token):
                        n = len(s)
                        if self._run >= n and tuple(
                                int(x) for x in source[at + 1 - n:at + 1]) == s:
                            subs.drop(s)
                return
            self._state, self._left, self._departed = _DEPARTED, at, i
            return
        if self._state == _DEPARTED:
            self._rejoin(i)
            return
        if i + 1 - self._begin >= REALIGN:
            at = self._locate(i)
            if at >= 0:
                self._state, self._at, self._run = _ALIGNED, at, REALIGN

    def _rejoin(self, i: int) -> None:
        """After the answer's token i, whether its last REALIGN tokens rejoin the source within
        SPAN_MAX of where it departed: then learn what it replaced (the shortest S)."""
        a_len = i + 1 - REALIGN - self._departed
        if a_len > SPAN_MAX:
            self._state = _LOST
            return
        if a_len < 1:
            return
        text, source, left = self.text, self.source, self._left
        tail = tuple(int(t) for t in text[i + 1 - REALIGN:i + 1])
        # Where the source is the text itself, the rejoined tokens must lie before the tail.
        end = i + 1 - REALIGN if source is text else len(source)
        for s_len in range(1, SPAN_MAX + 1):
            j = left + s_len
            if j + REALIGN > end:
                break
            if tuple(int(t) for t in source[j:j + REALIGN]) == tail:
                self.substitutions.learn(
                    tuple(int(t) for t in source[left:j]),
                    tuple(int(t) for t in text[self._departed:self._departed + a_len]))
                self._state, self._at, self._run = _ALIGNED, j + REALIGN, REALIGN
                return
