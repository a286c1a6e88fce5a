"""The engine's clock: milliseconds, wall time by default. Generation, calibration and the pair
take a `Clock`, so tests can drive them with a virtual clock whose time passes only when a fake
model decodes (a cost profile: a GPU, this CPU, a slow draft) instead of with wall time."""
from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], float]


def wall_ms() -> float:
    return time.perf_counter() * 1e3
