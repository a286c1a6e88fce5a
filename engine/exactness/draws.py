"""Drawing samples through the real generator and reducing them to the compared statistics.

A sample is the output up to the first newline (the generator stops there) or `cap` tokens.
The prompt stays in the target's and the draft's KV caches between samples (Session.sync
reuses the common prefix), so a sample costs only its own few tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Sequence

from engine.acceptance import verify
from engine.drafters.base import Drafter
from engine.events import DoneEvent
from engine.generator import GenerationConfig, VerifyRule, generate
from engine.policy import GammaPolicy
from engine.sampling import SamplingParams
from engine.session import Session

END = -1  # stands for "no token here": the output ended earlier


@dataclass
class Draws:
    samples: list[tuple[int, ...]] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def draw(target: Session, drafter: Drafter | None, prompt: Sequence[int], params: SamplingParams,
         n: int, *, gamma: int, cap: int, seed: int, rule: VerifyRule = verify,
         tick: Callable[[], None] | None = None,
         policy: Callable[[], GammaPolicy] | None = None,
         widths: Callable[[int], int] | None = None) -> Draws:
    """`n` outputs, each from its own seed `seed + i`; plain decoding when drafter is None.
    `policy` makes a fresh gamma policy per sample (default: fixed `gamma`); `widths` pads
    batches as the engine does (engine/widths.py)."""
    out = Draws()
    for i in range(n):
        config = GenerationConfig(params=replace(params, seed=seed + i),
                                  gamma=gamma if drafter is not None else 0,
                                  max_tokens=cap, stop=("\n",))
        done = None
        chosen = policy() if policy is not None and drafter is not None else None
        for ev in generate(target, drafter, prompt, config, policy=chosen, rule=rule,
                           widths=widths):
            if isinstance(ev, DoneEvent):
                done = ev
        assert done is not None
        out.samples.append(done.tokens)
        out.drafted += done.stats.drafted_tokens
        out.accepted += done.stats.accepted_tokens
        if tick is not None:
            tick()
    return out


def first_token(tokens: tuple[int, ...]) -> int:
    return tokens[0] if tokens else END


def first_two(tokens: tuple[int, ...]) -> tuple[int, int]:
    padded = (*tokens, END, END)
    return padded[0], padded[1]


def line_length(tokens: tuple[int, ...], token_bytes: Callable[[int], bytes], cap: int) -> int:
    """Tokens up to and including the one that ends the first line (a newline in its bytes,
    or the end of the output), capped at `cap`."""
    for i, t in enumerate(tokens):
        if b"\n" in token_bytes(t):
            return min(i + 1, cap)
    return min(len(tokens), cap)


def statistics(samples: Sequence[tuple[int, ...]], token_bytes: Callable[[int], bytes],
               cap: int) -> dict[str, list[Hashable]]:
    return {
        "first token": [first_token(s) for s in samples],
        "first two tokens": [first_two(s) for s in samples],
        "tokens to first newline": [line_length(s, token_bytes, cap) for s in samples],
    }
