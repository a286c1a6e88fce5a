"""How much of the machine other programs take while something is timed: the share of all its
CPUs that other processes used over a span, from the kernel's CPU counters (Linux
`/proc/stat`) less this process's own CPU time. A calibration (engine/control/costs.py) reads
it to tell when its figures are the machine's pace and when a browser, a build or another model
was sharing the cores. Where the counters cannot be read (not Linux), or the span is too short
for their tick, the share is unknown (None), never guessed.

`Load` is the capability a timing takes: called when the span starts, it gives the function
that ends it. `machine_load` reads the machine; `no_load` knows nothing (a virtual clock's
timings do not depend on the machine).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

# Ends a span: the share in [0, 1] of the machine's CPU time that other processes used over
# it, or None when unknown.
SpanEnd = Callable[[], float | None]
Load = Callable[[], SpanEnd]

# Shorter spans are below the counters' resolution (a tick is 10 ms on most kernels).
MIN_SPAN_S = 0.5
STAT = Path("/proc/stat")


def cpu_busy_s(stat: str, tick_hz: float) -> float | None:
    """Seconds of CPU time all CPUs spent busy (everything but idle and I/O wait, steal
    included: a neighbour's virtual machine takes the core too), from `/proc/stat`'s text.

    >>> cpu_busy_s("cpu  100 0 50 800 10 0 0 40 0 0\\ncpu0 1 2 3", 100.0)
    1.9
    """
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                ticks = [int(f) for f in fields[1:]]
            except ValueError:
                return None
            if len(ticks) < 4:
                return None
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            # guest and guest_nice are already counted in user and nice.
            return (sum(ticks[:8]) - idle) / tick_hz
    return None


def others_share(busy_s: float, own_s: float, wall_s: float, cpus: int) -> float | None:
    """The share of `cpus` CPUs over `wall_s` seconds that others used, when all CPUs were busy
    `busy_s` and this process `own_s` of it.

    >>> others_share(busy_s=1.5, own_s=1.0, wall_s=1.0, cpus=2)
    0.25
    """
    if wall_s < MIN_SPAN_S or cpus < 1:
        return None
    return min(max((busy_s - own_s) / (wall_s * cpus), 0.0), 1.0)


def _read_busy() -> float | None:
    try:
        text = STAT.read_text(encoding="ascii")
        tick_hz = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return None
    return cpu_busy_s(text, tick_hz)


def _own_s() -> float:
    t = os.times()
    return t.user + t.system


def machine_load() -> SpanEnd:
    """Start a span on this machine's counters."""
    busy0, own0, wall0 = _read_busy(), _own_s(), time.monotonic()

    def end() -> float | None:
        busy1 = _read_busy()
        if busy0 is None or busy1 is None:
            return None
        return others_share(busy1 - busy0, _own_s() - own0, time.monotonic() - wall0,
                            os.cpu_count() or 1)
    return end


def no_load() -> SpanEnd:
    """A span of which nothing is known."""
    return lambda: None
