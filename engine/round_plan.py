"""A round's plan: what a drafter would do after the committed text, asked once per round.

The drafter answers `plan(context, params)` before the policy decides: where the round's draft
would come from (its `source`: a model, a copy from the context, a copy from the history of past
requests, or nothing), what a copy would propose and how long its match is, how far a model is
behind the text, and whether the draft samples from q. The policy prices the round from the plan
and the drafter drafts from the same plan (`propose(plan, gamma, ...)`), so nothing is matched
twice and the price is always that of the round that runs.

A plan is a function of the committed text (and of the history as the generation began) alone,
which is what an exact decision may read (docs/EXACTNESS.md). One more way of drafting is one more
`source`: its plan says what the round would do, and the cost model prices it by `model_drafts`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

# Where a round's draft comes from. A copy costs no draft decode and no catch-up.
MODEL = "model"
CONTEXT = "context"
HISTORY = "history"
# A copy from the answer the client predicted (engine/drafters/prediction.py).
PREDICTION = "prediction"
COPY_SOURCES = (CONTEXT, HISTORY, PREDICTION)
# The plan of a round with nothing to draft (plain decoding, a copy without a match).
NOTHING = ""

# Match lengths are counted in buckets: a 2-token match and a 16-token one are different bets
# (suffix decoding sizes speculation by the match), and buckets doubling in width keep the
# counts per bucket large where matches are rare, up to the 64 tokens a match is counted to
# (the copy's own length is not in the key: it caps the round, and acceptance is kept per
# position, engine/control/estimator.py).
_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 1 << 30))


def shorter_keys(key: str) -> tuple[str, ...]:
    """The acceptance keys of the same copy source at every shorter match bucket, nearest
    first; none for the model's key or a copy's shortest bucket.

    >>> shorter_keys("context@8-15"), shorter_keys("model")
    (('context@4-7', 'context@3', 'context@2', 'context@1'), ())
    """
    source, at, bucket = key.partition("@")
    if not at or bucket not in _BUCKET_NAMES:
        return ()
    i = _BUCKET_NAMES.index(bucket)
    return tuple(f"{source}@{b}" for b in reversed(_BUCKET_NAMES[:i]))


def match_bucket(length: int) -> str:
    """The bucket of a match of `length` tokens, as it is written in reasons and acceptance keys.

    >>> [match_bucket(n) for n in (1, 2, 5, 8, 20, 40, 64)]
    ['1', '2', '4-7', '8-15', '16-31', '32-63', '64+']
    """
    for lo, hi in _BUCKETS:
        if length <= hi:
            return str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+")
    return f"{_BUCKETS[-1][0]}+"


_BUCKET_NAMES = tuple(match_bucket(lo) for lo, _ in _BUCKETS)


@dataclass(frozen=True)
class RoundPlan:
    # MODEL, CONTEXT, HISTORY, PREDICTION, or NOTHING.
    source: str = NOTHING
    # The drafter part that would draft, by name, for reports ("draft-model", "prompt-lookup").
    drafter: str = ""
    # A copy's continuation, and the history's share of each token among the occurrences that
    # reached it (empty for a copy from the context: every token is taken).
    tokens: tuple[int, ...] = ()
    shares: tuple[float, ...] = ()
    # Tokens of the text's end the copy matched.
    match: int = 0
    # The history's document the copy comes from (accepted copies refresh it); -1: none.
    document: int = -1
    # Committed tokens a model must decode before it drafts (its catch-up).
    behind: int = 0
    # Whether the draft draws its tokens from q: it then gives q rows, and its round's verify
    # width is fixed before drafting (engine/round.py).
    samples: bool = False
    # The committed text the plan was made after (a model drafts after it). Not compared: the
    # plan is a value, the text the generation's.
    context: Sequence[int] = field(default=(), compare=False, repr=False)

    @property
    def drafts(self) -> bool:
        """Whether the round has anything to draft from."""
        return self.source != NOTHING

    @property
    def is_copy(self) -> bool:
        """Whether the round copies text rather than running a model."""
        return self.source in COPY_SOURCES

    @property
    def model_drafts(self) -> bool:
        """Whether the round pays a model's decodes (and its catch-up)."""
        return self.source == MODEL

    @property
    def acceptance_key(self) -> str:
        """The key acceptance is counted under (engine/control/estimator.py): the model, or a
        copy source at its match length's bucket.

        >>> RoundPlan(CONTEXT, match=2).acceptance_key, RoundPlan(MODEL).acceptance_key
        ('context@2', 'model')
        """
        if self.is_copy:
            return f"{self.source}@{match_bucket(self.match)}"
        return self.source


NO_PLAN = RoundPlan()
