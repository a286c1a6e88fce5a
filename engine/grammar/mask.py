"""The tokens a grammar allows next, and p or q under that constraint.

A constraint is part of the sampling distribution: at a position whose grammar state allows the
tokens A, the constrained row is the logits with every token outside A set to -inf, then the
one transform (engine/transform.py): temperature, top-k, top-p and min-p act on the allowed
tokens only, and the row is renormalised over them. Target and draft rows at the same position
are masked by the same state (engine/grammar/guide.py), so the acceptance rule works on the
constrained p and q and the output follows the constrained target exactly.

The mask is llguidance's layout, a bitmask of 32-bit words:

    words [ceil(V / 32)] uint32; bit j of word i allows token 32 i + j

Two representations of the masked row, chosen by how many tokens the mask allows, give the
same distribution (tests/test_grammar_mask.py enumerates both, ties at top-k and top-p
boundaries included):
- few allowed (keys, digits, punctuation): the transform runs on the allowed logits alone, and
  the row is lifted back onto their ids; nothing touches the rest of the vocabulary;
- many allowed (free text inside a string): the row is offset by a bias of 0 on the allowed
  tokens and -1e30 on the others (`BANNED`: its exponential is 0 at any temperature, like -inf's,
  and an add is branch-free where selecting by a scattered mask costs ten times more), and the
  transform's own lazy paths apply. Greedy needs no row at all when the unmasked argmax is
  allowed (it is then the lowest id among the allowed maxima too).

Example: V = 8, A = {2, 5}, logits l: p(2) = e^l2 / (e^l2 + e^l5), p(5) the rest, 0 elsewhere.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import numpy.typing as npt

from engine.confidence import top_probability
from engine.dist import Dist
from engine.errors import GrammarError
from engine.sampling import SamplingParams
from engine.transform import Rows, distribution

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]

# A mask allowing at most this share of the vocabulary is transformed on its tokens alone
# (tests set it to 0 or 1 to run either path on the same rows).
SPARSE_SHARE = 1 / 8

_BIT = np.arange(32, dtype=np.uint32)
# The logit a banned token gets on the wide path: exp((BANNED - max) / T) underflows to 0.
BANNED = np.float32(-1e30)


class TokenMask:
    """The tokens allowed at one grammar state."""

    __slots__ = ("n_vocab", "words", "count", "_ids", "_dense", "_bias")

    def __init__(self, n_vocab: int, words: U32) -> None:
        self.n_vocab = n_vocab
        # Bits past the vocabulary (llguidance's tokenizer may be longer or padded) never count.
        words = np.asarray(words, dtype=np.uint32)[:(n_vocab + 31) // 32]
        if n_vocab % 32 and words.size == (n_vocab + 31) // 32 and words[-1] >> (n_vocab % 32):
            words = words.copy()
            words[-1] &= np.uint32((1 << (n_vocab % 32)) - 1)
        self.words = words
        self.count = int(np.bitwise_count(words).sum())
        self._ids: I64 | None = None
        self._dense: npt.NDArray[np.bool_] | None = None
        self._bias: F32 | None = None

    @classmethod
    def of(cls, n_vocab: int, allowed) -> "TokenMask":
        """The mask allowing the token ids `allowed` (tests and fakes)."""
        bits = np.zeros(((n_vocab + 31) // 32) * 32, dtype=bool)
        bits[np.asarray(list(allowed), dtype=np.int64)] = True
        return cls(n_vocab, np.packbits(bits, bitorder="little").view(np.uint32))

    @property
    def single(self) -> int | None:
        """The one token allowed, when exactly one is: the constrained row is one-hot there, so
        the token is committed without a model (a forced token)."""
        if self.count != 1:
            return None
        return int(self.ids()[0])

    def allows(self, token: int) -> bool:
        if not 0 <= token < self.n_vocab:
            return False
        return bool((int(self.words[token >> 5]) >> (token & 31)) & 1)

    def ids(self) -> I64:
        """The allowed ids, ascending: only the words with a bit set are unpacked."""
        if self._ids is None:
            nz = np.flatnonzero(self.words)
            bits = ((self.words[nz, None] >> _BIT) & 1).astype(bool)
            self._ids = (nz[:, None] * 32 + _BIT.astype(np.int64))[bits]
        return self._ids

    def _bits(self) -> npt.NDArray[np.uint8]:
        """[V] uint8, 1 where allowed: the one unpacking `dense` and `bias` share."""
        if self._dense is None:
            bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")
            self._dense = bits[:self.n_vocab].view(bool)
        return self._dense.view(np.uint8)

    def dense(self) -> npt.NDArray[np.bool_]:
        """[V] bool, True where allowed."""
        return self._bits().view(bool)

    def bias(self) -> F32:
        """[V] float32: 0 where allowed, BANNED elsewhere (the wide path's offset)."""
        if self._bias is None:
            self._bias = (self._bits().astype(np.float32) - np.float32(1)) * -BANNED
        return self._bias

    @property
    def sparse(self) -> bool:
        """Whether a masked row is formed on the allowed tokens alone (few of them)."""
        return self.count <= SPARSE_SHARE * self.n_vocab


def masked_logits(logits: F32, mask: TokenMask) -> F32:
    """The row the transform sees under `mask`: the allowed logits alone (in the order of
    `mask.ids()`) when the mask is sparse, else the whole row offset by the mask's bias."""
    row = np.asarray(logits, dtype=np.float32)
    return row[mask.ids()] if mask.sparse else row + mask.bias()


def masked_distribution(logits: F32, params: SamplingParams, mask: TokenMask | None) -> Dist:
    """`distribution(logits, params)` under the constraint `mask` (None: unconstrained)."""
    if mask is None:
        return distribution(logits, params)
    if mask.count == 0:
        raise GrammarError("the grammar allows no token here: this model's vocabulary cannot "
                           "spell what it asks for")
    if mask.sparse:
        ids = mask.ids()
        sub = distribution(masked_logits(logits, mask), params)
        if sub.ids is None:
            return Dist(mask.n_vocab, ids, sub.w, sub.total)
        return Dist(mask.n_vocab, ids[sub.ids], sub.w, sub.total)
    if params.greedy:
        best = int(np.argmax(logits))
        if mask.allows(best):
            return Dist.one_hot(mask.n_vocab, best)
    return distribution(masked_logits(logits, mask), params)


def masked_top_probability(logits: F32, mask: TokenMask) -> float:
    """The largest probability of the masked row at temperature 1: how sure a greedy draft is,
    under the constraint. A statistic for stopping rules, estimated as engine/confidence.py
    estimates the unmasked one (a banned token's exponential is 0)."""
    return float(top_probability(masked_logits(logits, mask)[None, :])[0])


def has_allowed_finite(logits: F32, mask: TokenMask) -> bool:
    """Whether any token the mask allows has a finite logit (a draft with a trimmed vocabulary
    may have none: it cannot draft there). A banned logit sits near BANNED, -inf stays -inf."""
    return bool(float(masked_logits(logits, mask).max()) > BANNED / 2)


class MaskedRows(Rows):
    """`Rows` under a grammar: row i masked by `masks(i)`, the state after the round's first i
    tokens, computed only when the row is read (engine/grammar/guide.py)."""

    def __init__(self, logits: F32, params: SamplingParams,
                 masks: Callable[[int], TokenMask]) -> None:
        super().__init__(logits, params)
        self._masks = masks

    def _transform(self, i: int) -> Dist:
        return masked_distribution(self._logits[i], self._params, self._masks(i))
