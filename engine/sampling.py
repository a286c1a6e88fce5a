"""Sampling settings: temperature, top-k, top-p, min-p and the seed, checked once.

Notation (used across the engine): `p` is the target's distribution, `q` the draft's. Both come
from the one logits transform (engine/transform.py) under these settings, so temperature, top-k,
top-p and min-p shape p and q the same way and speculative sampling is exact with respect to the
*transformed* target. The engine's randomness is engine/rng.py; a row's confidence statistic is
engine/confidence.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engine.errors import SettingsError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise SettingsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SettingsError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise SettingsError(f"top-p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise SettingsError(f"min-p must be in [0, 1), got {self.min_p}")
        if self.seed is not None and self.seed < 0:
            raise SettingsError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def as_dict(self) -> dict:
        return asdict(self)


# Greedy decoding's settings: a row's argmax, the lowest id among equals.
GREEDY = SamplingParams(temperature=0.0)
