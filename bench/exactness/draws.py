"""Drawing samples through the real generator and reducing them to the compared statistics.

A sample is the first `n` tokens of an answer (fewer when it ends first). The prompt stays in
the target's and the draft's KV caches between samples (Session.sync reuses the common prefix),
so a sample costs only its own tokens. The statistic at position k is the pair of tokens at
k-1 and k (the prompt's last token stands before position 0; END after the answer ended): where
a bias sits at position k, it shows in that pair's law.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Sequence

from engine.acceptance import verify
from engine.drafters.base import Drafter
from engine.events import DoneEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.round import VerifyRule
from engine.control.policy import GammaPolicy
from engine.sampling import SamplingParams
from engine.session import Session

END = -1  # stands for "no token here": the output ended earlier


@dataclass
class Draws:
    samples: list[tuple[int, ...]] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    # How many samples had their token at position k accepted from a draft.
    drafted_at: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def draw(target: Session, drafter: Drafter | None, prompt: Sequence[int], params: SamplingParams,
         n: int, *, gamma: int, tokens: int, seed: int, rule: VerifyRule = verify,
         tick: Callable[[], None] | None = None,
         policy: Callable[[], GammaPolicy] | None = None,
         widths: Callable[[int], int] | None = None) -> Draws:
    """`n` answers cut to their first `tokens` tokens, each from its own seed `seed + i`; plain decoding
    when drafter is None. `policy` makes a fresh gamma policy per sample (default: fixed
    `gamma`), as every request gets one; `widths` pads batches as the engine does."""
    out = Draws(drafted_at=[0] * tokens)
    for i in range(n):
        # One token more than is compared: a round never drafts the answer's last token (it
        # is the target's own), so the last compared position could not have been drafted.
        config = GenerationConfig(params=replace(params, seed=seed + i),
                                  gamma=gamma if drafter is not None else 0,
                                  max_tokens=tokens + 1)
        done = None
        chosen = policy() if policy is not None and drafter is not None else None
        for ev in generate(target, drafter, prompt, config, policy=chosen, rule=rule,
                           widths=widths):
            if isinstance(ev, DoneEvent):
                done = ev
        assert done is not None
        out.samples.append(done.tokens[:tokens])
        out.drafted += done.stats.drafted_tokens
        out.accepted += done.stats.accepted_tokens
        for k, origin in enumerate(done.stats.origins[:tokens]):
            out.drafted_at[k] += origin == "draft"
        if tick is not None:
            tick()
    return out


def pair_at(sample: tuple[int, ...], k: int, before: int) -> tuple[int, int]:
    """The tokens at positions k-1 and k (`before` is the prompt's last token; END past the
    end of the answer)."""
    seq = (before, *sample, *([END] * (k + 1)))
    return seq[k], seq[k + 1]


def statistics(samples: Sequence[tuple[int, ...]], positions: Sequence[int],
               before: int) -> dict[str, list[Hashable]]:
    return {f"tokens {k - 1},{k}": [pair_at(s, k, before) for s in samples] for k in positions}
