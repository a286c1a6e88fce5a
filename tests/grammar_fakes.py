"""A grammar over a tiny vocabulary, as a token automaton: the `Constraint` of
engine/grammar/guide.py without llguidance, for exact enumeration on 8-token fakes.

The vocabulary spells bytes (token 7 ends the answer):

    0 "a"   1 "b"   2 "ab"   3 "c"   4 "d"   5 "cd"   6 "e"   7 <end>

and the grammar is "e" | ( ("a" | "b" | "ab") "cd" "e" )+ "e"?, at the token level:

    S0 -a-> S1   S0 -b-> S2   S0 -ab-> S2   S0 -e-> S6
    S1 -b-> S2   S1 -c-> S3   S1 -cd-> S4         ("a" "b" spells "ab" too)
    S2 -c-> S3   S2 -cd-> S4                      the bytes "cd" are forced, but two
    S3 -d-> S4                                    tokenizations spell them: not forced
    S4 -e-> S5                                    one token allowed: forced
    S5 -a-> S1   S5 -b-> S2   S5 -ab-> S2   S5 -e-> S6   S5 -<end>   (the answer may end)
    S6 -<end>                                     the end forced

so the walk has forced tokens ("d" after "c", "e" after "cd"), forced chains ("d" "e"), a
byte string the grammar forces with two tokenizations ("cd" or "c" "d"), and a forced end.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from engine.backend import TokenTable
from engine.grammar.guide import Guide
from engine.grammar.mask import TokenMask, masked_distribution
from engine.sampling import SamplingParams
from bench.fakes.table import TableFake

V, END = 8, 7
EDGES: dict[int, dict[int, int]] = {
    0: {0: 1, 1: 2, 2: 2, 6: 6},
    1: {1: 2, 3: 3, 5: 4},
    2: {3: 3, 5: 4},
    3: {4: 4},
    4: {6: 5},
    5: {0: 1, 1: 2, 2: 2, 6: 6},
    6: {},
}
ACCEPTING = {5, 6}


def allowed(state: int) -> list[int]:
    return sorted(EDGES[state]) + ([END] if state in ACCEPTING else [])


class AutomatonConstraint:
    """The grammar's state over one answer: a stack of automaton states."""

    n_vocab = V

    def __init__(self) -> None:
        self.states = [0]
        self.masks_computed = 0

    def mask(self) -> TokenMask:
        self.masks_computed += 1
        return TokenMask.of(V, allowed(self.states[-1]))

    def consume(self, tokens: Sequence[int]) -> int:
        took = 0
        for t in tokens:
            nxt = EDGES.get(self.states[-1], {}).get(int(t))
            if nxt is None:
                break
            self.states.append(nxt)
            took += 1
        return took

    def rollback(self, n: int) -> None:
        assert 0 <= n < len(self.states)
        del self.states[len(self.states) - n:]


class AutomatonGrammar:
    def start(self) -> AutomatonConstraint:
        return AutomatonConstraint()


def constrained_law(row, prompt: Sequence[int], params: SamplingParams, n: int,
                    start=AutomatonConstraint, end: int = END) -> dict:
    """The law of the first `n` tokens of plain constrained sampling: at each position the
    target's row `row(context)` masked by the grammar's state after the answer so far
    (a fresh constraint from `start` walked over it; engine/grammar/mask.py), computed
    directly; the `end` token ends the output unseen."""
    law: dict = {}

    def walk(out: tuple[int, ...], prob: float) -> None:
        if len(out) == n:
            law[out] = law.get(out, 0.0) + prob
            return
        constraint = start()
        assert constraint.consume(list(out)) == len(out)
        p = masked_distribution(row(list(prompt) + list(out)), params,
                                constraint.mask()).to_dense()
        for x in np.flatnonzero(p > 0):
            if x == end:
                law[out] = law.get(out, 0.0) + prob * float(p[x])
            else:
                walk(out + (int(x),), prob * float(p[x]))

    walk((), 1.0)
    return law


class ByteJumpGuide(Guide):
    """The negative control for forced tokens: besides the tokens the mask allows alone, it
    jumps over the byte string the grammar forces, "cd", with one tokenization ("cd", the way
    a forced-bytes fast-forward tokenizes it), though the target could also spell it "c" "d"."""

    def forced(self, limit: int) -> tuple[list[int], bool]:
        chain, complete = super().forced(limit)
        state = self.constraint.states[-1]  # type: ignore[attr-defined]
        if not complete and state == 2 and len(chain) < limit:
            self.constraint.consume([5])
            self._masks.clear()
            more, complete = super().forced(limit - len(chain) - 1)
            chain += [5, *more]
        return chain, complete


class SpelledTable(TableFake):
    """TableFake's rows over a vocabulary of byte strings, `PIECES` (the empty one, `END`, ends
    the answer), with a tokenize function consistent with them: the longest piece first
    (llguidance tokenizes what a grammar forces, and allows only the canonical spelling)."""
    PIECES: tuple[bytes, ...] = ()
    END = -1

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data, out = text.encode(), []
        while data:
            # Bytes this vocabulary cannot spell are dropped (no prompt here has any).
            spell = [i for i, p in enumerate(self.PIECES) if p and data.startswith(p)]
            if not spell:
                data = data[1:]
                continue
            t = max(spell, key=lambda i: len(self.PIECES[i]))
            out.append(t)
            data = data[len(self.PIECES[t]):]
        return out

    def token_bytes(self, token: int) -> bytes:
        return self.PIECES[token]

    def token_table(self) -> TokenTable:
        return TokenTable(tuple(b"<end>" if t == self.END else p
                                for t, p in enumerate(self.PIECES)), frozenset({self.END}),
                          self.END)
