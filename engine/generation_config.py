"""What one generation is asked for: the sampling, the most a round may draft, the token budget,
the stop strings, the grammar its answer follows and whether to report log probabilities. The generator runs it (engine/generator.py) and the answer ends by it
(engine/answer.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.errors import SettingsError
from engine.grammar.guide import CompiledGrammar
from engine.logprobs import MAX_TOP
from engine.sampling import SamplingParams

# The most a request's `gamma` may be: under the adaptive policy, the most the draft model drafts
# in a round; under a fixed policy, what every round drafts.
MAX_GAMMA = 32
# The most a copy drafts in one round (a plan whose `is_copy` holds: prompt lookup, the history
# of past requests, a client's prediction; engine/round_plan.py), whatever the request's gamma:
# a copy costs no draft decode, and on a steep CPU verify curve only copies of 16 to 64 tokens
# pay (issue 62: a verify of 64 costs 27.8 tokens on a Zen 4). The adaptive controller prices
# each copy at its own length up to this (docs/design/controller.md); a fixed policy caps copies
# at its gamma, which is how a user caps them.
COPY_MAX = 64


@dataclass(frozen=True)
class GenerationConfig:
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = 4
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    # The grammar the answer must follow (part of p and q: engine/grammar/mask.py); None: free.
    grammar: CompiledGrammar | None = field(default=None, compare=False)
    # Each committed token's log probability with this many alternatives (0..20); None: none.
    logprobs: int | None = None
    # A rule read on the answer's text as it is committed (each new piece in turn) that ends it,
    # as a stop string does, when it returns True (a tool call repeated: app/runtime/
    # tool_reading.py); stateful, so made fresh for each generation. None: no such rule.
    until: Callable[[str], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (0 <= self.gamma <= MAX_GAMMA):
            raise SettingsError(f"gamma must be between 0 and {MAX_GAMMA}, got {self.gamma}")
        if self.max_tokens < 1:
            raise SettingsError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP:
            raise SettingsError(f"top logprobs must be between 0 and {MAX_TOP}, got {self.logprobs}")
