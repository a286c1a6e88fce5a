"""How many tokens to draft each round. The generator asks `next_gamma()` before a round and
reports the round back through `update(round)`; `FixedGamma` is the plain policy."""
from __future__ import annotations

from typing import Protocol

from engine.stats import RoundStats


class GammaPolicy(Protocol):
    name: str

    def next_gamma(self) -> int: ...

    def update(self, r: RoundStats) -> None: ...


class FixedGamma:
    def __init__(self, gamma: int) -> None:
        self.name = f"fixed-{gamma}"
        self.gamma = gamma

    def next_gamma(self) -> int:
        return self.gamma

    def update(self, r: RoundStats) -> None:
        pass
