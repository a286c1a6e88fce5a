"""Events the generator yields; the CLI and the UI only format them.

Origins of a committed token: "draft" (a drafted token the target accepted), "correction"
(sampled by the target after a rejection), "bonus" (sampled by the target after every drafted
token was accepted), "plain" (a plain decoding step: plain decoding, or a round in which
the gamma policy drafted nothing) and "forced" (the only token a grammar allows, committed
without a model: engine/grammar/guide.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.logprobs import TokenLogprob
from engine.stats import GenerationStats, RoundStats

FORCED = "forced"


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str
    origin: str
    index: int
    # The target's log probability of the token, when the generation was asked for them.
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class RoundEvent:
    round: RoundStats
    stats: GenerationStats


@dataclass(frozen=True)
class DoneEvent:
    text: str
    stats: GenerationStats
    tokens: tuple[int, ...]


Event = TokenEvent | RoundEvent | DoneEvent
