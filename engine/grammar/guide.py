"""A grammar's state over the answer (`Constraint`), and one round's walk over it (`Guide`).

The exactness of constrained speculation rests on one rule: the target's row i and the draft's
row i are masked by the same state, the grammar after the committed text and x_0..x_{i-1}.
The guide holds that state for a round:

    committed text ── forced tokens ── x_0 ── x_1 ── ... ── x_{γ-1}
                     (mask allows one)  mask_0   mask_1        mask_γ (bonus row)

- `forced`: while the mask allows exactly one token, that token is the constrained target's
  only possible one (p is one-hot), so it is committed with probability 1 and no model drafts
  it. A forced end-of-generation token ends the answer without a target call. Only the token
  level counts: a byte string the grammar forces but that several tokenizations spell is not
  forced, and the mask (which allows each of their first tokens) says so.
- the draft: a model masks its q_i with `mask()` before drawing x_i and `push`es x_i; a copy
  (which has no q) is cut before its first token the grammar forbids (`walk`), a function of
  the committed text like the copy itself.
- verification reads `mask_at(i)` for the rows it transforms, lazily, walking the grammar
  forward or back to state i; rows past the first rejection are never masked.
- `settle`: the grammar ends the round at the committed text: the accepted drafts, then the
  correction or bonus token.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from engine.errors import GrammarError
from engine.grammar.mask import TokenMask


class Constraint(Protocol):
    """A grammar's state over the tokens of one answer (llguidance's matcher,
    engine/grammar/llg.py; a small automaton in tests)."""

    n_vocab: int

    def mask(self) -> TokenMask:
        """The tokens allowed after the tokens consumed so far."""

    def consume(self, tokens: Sequence[int]) -> int:
        """Consume `tokens` in order up to the first one the grammar forbids; how many it took."""

    def rollback(self, n: int) -> None:
        """Forget the last `n` tokens consumed."""


class CompiledGrammar(Protocol):
    """A grammar ready for one vocabulary (engine/grammar/llg.py's `Grammar`): each generation
    starts its own walk through it."""

    def start(self) -> Constraint:
        """A fresh constraint at the start of an answer."""


class Guide:
    """One round's walk over `constraint`, which starts at the committed text. An
    end-of-generation token ends the walk: nothing the round offers after it is committed, so
    the grammar never consumes it, and a row after it (read only by a draw the answer drops) is
    masked to the end token again."""

    def __init__(self, constraint: Constraint, is_eog: Callable[[int], bool]) -> None:
        self.constraint = constraint
        self.is_eog = is_eog
        # The tokens the round walks after the forced ones, and the mask at each depth known so far.
        self.tokens: list[int] = []
        self._masks: dict[int, TokenMask] = {}
        self._depth = 0  # tokens of self.tokens the constraint has consumed

    def forced(self, limit: int) -> tuple[list[int], bool]:
        """The chain of forced tokens (at most `limit`), consumed; and whether the grammar then
        allows only an end-of-generation token (the answer is complete)."""
        chain: list[int] = []
        while True:
            token = self.mask().single
            if token is None:
                return chain, False
            if self.is_eog(token):
                return chain, True
            if len(chain) >= limit:
                return chain, False
            self.constraint.consume([token])
            self._masks.clear()
            chain.append(token)

    def _go(self, depth: int) -> None:
        """Move the constraint to `depth` tokens into the round's walk (none of them the end)."""
        if depth < self._depth:
            self.constraint.rollback(self._depth - depth)
        elif depth > self._depth:
            took = self.constraint.consume(self.tokens[self._depth:depth])
            if took != depth - self._depth:
                raise _refused(self.tokens[self._depth + took])
        self._depth = depth

    def _ended(self, depth: int) -> bool:
        return depth > 0 and self.is_eog(self.tokens[depth - 1])

    def mask_at(self, depth: int) -> TokenMask:
        """The mask after the walk's first `depth` tokens: row `depth`'s constraint."""
        m = self._masks.get(depth)
        if m is None:
            if self._ended(depth):
                m = TokenMask.of(self.constraint.n_vocab, [self.tokens[depth - 1]])
            else:
                self._go(depth)
                m = self.constraint.mask()
            self._masks[depth] = m
        return m

    def mask(self) -> TokenMask:
        """The mask at the end of the walk (the next draft row's)."""
        return self.mask_at(len(self.tokens))

    def push(self, token: int) -> None:
        """Extend the walk by a token the current mask allows (a constrained draft's draw)."""
        self.tokens.append(int(token))

    def walk(self, drafted: Sequence[int]) -> int:
        """Make the walk the round's drafted tokens: those a model pushed as it drew them, then
        the rest (a copy's) up to the first one the grammar forbids. How many it holds."""
        drafted = [int(t) for t in drafted]
        pushed = len(self.tokens)
        assert drafted[:pushed] == self.tokens, "the draft is not the walk it pushed"
        rest = drafted[pushed:]
        if rest and not self._ended(pushed):
            end = next((i for i, t in enumerate(rest) if self.is_eog(t)), len(rest))
            self._go(pushed)
            took = self.constraint.consume(rest[:end])
            self.tokens.extend(rest[:took])
            self._depth = len(self.tokens)
            if took == end < len(rest) and self.mask().allows(rest[end]):
                self.tokens.append(rest[end])
        return len(self.tokens)

    def settle(self, n_accepted: int, token: int) -> None:
        """End the round at the committed text: the walk's first `n_accepted` tokens, then
        `token` (after an end-of-generation token nothing is committed)."""
        if not self._ended(n_accepted) and not self.is_eog(token):
            self._go(n_accepted)
            took = self.constraint.consume([int(token)])
            if took != 1:
                raise _refused(token)
        elif self._depth > n_accepted:
            self._go(n_accepted)
        self.tokens.clear()
        self._masks.clear()
        self._depth = 0


def _refused(token: int) -> GrammarError:
    # The grammar engine refused a token its own mask allowed: it and the vocabulary disagree
    # (a tokenizer that cannot spell what the grammar forces). The answer cannot go on exactly.
    return GrammarError(f"the grammar engine refused token {token}, which its mask allowed: "
                        "the grammar and this model's vocabulary disagree")
