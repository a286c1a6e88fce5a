"""The drafter protocol shared by every way of proposing tokens.

`propose(context, gamma, params, rng)` returns up to `gamma` token ids and, when the drafter
sampled them from a distribution q, the rows of q (`[n, V]`); `q is None` means the tokens carry
no probabilities and are verified with the one-hot rule (q one-hot at each token, which is also
what a model drafting greedily has, so it gives no rows). `confidence` (optional) is the
drafter's own estimate, per token, that the target will accept it (a model drafter: its
probability of the token, untempered when decoding greedily, where q is one-hot); policies may
trim a proposal on it. `feedback` (optional) hears how many of the proposed tokens the target
accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import numpy.typing as npt

from engine.sampling import F64, SamplingParams

I32 = npt.NDArray[np.int32]


@dataclass
class Proposal:
    tokens: I32
    q: F64 | None = None
    time_ms: float = 0.0
    # Which drafter produced the tokens (the hybrid drafter delegates).
    source: str = ""
    meta: dict = field(default_factory=dict)
    confidence: F64 | None = None

    def __len__(self) -> int:
        return len(self.tokens)


def empty_proposal(source: str) -> Proposal:
    return Proposal(tokens=np.zeros(0, dtype=np.int32), q=None, source=source)


@runtime_checkable
class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], gamma: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal: ...


def give_feedback(drafter: Drafter, proposal: Proposal, n_accepted: int) -> None:
    hook = getattr(drafter, "feedback", None)
    if hook is not None:
        hook(proposal, n_accepted)
