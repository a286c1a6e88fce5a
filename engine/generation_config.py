"""What one generation is asked for: the sampling, the most a round may draft, the token budget
and the stop strings. The generator runs it (engine/generator.py) and the answer ends by it
(engine/answer.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import SettingsError
from engine.sampling import SamplingParams

MAX_GAMMA = 32


@dataclass(frozen=True)
class GenerationConfig:
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = 4
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (0 <= self.gamma <= MAX_GAMMA):
            raise SettingsError(f"gamma must be between 0 and {MAX_GAMMA}, got {self.gamma}")
        if self.max_tokens < 1:
            raise SettingsError(f"max tokens must be >= 1, got {self.max_tokens}")
