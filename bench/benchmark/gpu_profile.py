"""The measured GPU profile: one GPU run's verify curve and draft cost, read from that run's
result file (`PROFILE`, written from `scripts/gpu-check`'s report by `python -m scripts.gpu_check
profile`), and the label every GPU figure carries. theory.py's prediction, the replay
(bench/research/policy_sim.py), the concurrency and batch replays (bench/fakes/costed.py's `GPU`)
and the reports price rounds with it; nothing else holds a GPU curve.

The file holds the target's verify times (a decode of w tokens, every row's logits) at the widths
measured, the draft's decode times at the same widths, the device, the pair's shapes, the build and
the date. Between measured widths the cost is interpolated linearly; past the widest one it is
extended linearly at the measured points' mean slope, (v(W) - v(1)) / (W - 1) a row, for the
verify and the draft alike: the label says so, and from which width.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The H200 run (docs/BENCHMARKS.md, "The GPU path"): the one GPU measured.
PROFILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "latest" / "gpu" / "h200-profile.json"
KEYS = ("name", "device", "target", "draft", "build", "date", "source", "widths", "verify_ms",
        "draft_ms")


@dataclass(frozen=True)
class GpuProfile:
    """One GPU's measured costs (module docstring); ms throughout."""
    name: str
    device: str
    target: str
    draft: str
    build: str
    date: str
    source: str
    widths: tuple[int, ...]
    verify_ms: tuple[float, ...]
    draft_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        w = self.widths
        if not w or w[0] != 1 or any(b <= a for a, b in zip(w, w[1:])):
            raise ValueError(f"a GPU profile's widths must rise from 1, got {list(w)}")
        if len(self.verify_ms) != len(w) or len(self.draft_ms) != len(w):
            raise ValueError("a GPU profile needs one verify and one draft time per width")
        if min(self.verify_ms) <= 0 or min(self.draft_ms) <= 0:
            raise ValueError("a GPU profile's times must be positive")

    @property
    def widest(self) -> int:
        return self.widths[-1]

    def _at(self, table: tuple[float, ...], w: int) -> float:
        if w < 1:
            raise ValueError(f"a decode has at least one token, got {w}")
        if w <= self.widest:
            return float(np.interp(w, self.widths, table))
        slope = (table[-1] - table[0]) / (self.widest - 1) if self.widest > 1 else 0.0
        return float(table[-1] + max(slope, 0.0) * (w - self.widest))

    def verify(self, w: int) -> float:
        """A target decode of `w` tokens, every row's logits."""
        return self._at(self.verify_ms, w)

    def draft_decode(self, w: int) -> float:
        """A draft decode of `w` tokens (one drafted token at w = 1, a catch-up past it)."""
        return self._at(self.draft_ms, w)

    def verify_table(self, n: int) -> tuple[float, ...]:
        return tuple(self.verify(w) for w in range(1, n + 1))

    def draft_table(self, n: int) -> tuple[float, ...]:
        return tuple(self.draft_decode(w) for w in range(1, n + 1))

    def ratio(self, w: int) -> float:
        """A verify of `w` tokens over one token."""
        return self.verify(w) / self.verify_ms[0]

    @property
    def draft_cost(self) -> float:
        """One drafted token of the draft model, in target tokens (c)."""
        return self.draft_ms[0] / self.verify_ms[0]

    @property
    def extension(self) -> str:
        """How the curve is read past its widest measured width."""
        slope = (self.verify_ms[-1] - self.verify_ms[0]) / (self.widest - 1) if self.widest > 1 else 0.0
        return (f"measured at widths {_widths_text(self.widths)}, past {self.widest} linear at "
                f"+{max(slope, 0.0):.2f} ms a row, the measured mean slope")

    @property
    def label(self) -> str:
        """What every figure on this profile is labelled with: the device, the target's shape
        (without its details) and the date."""
        return f"{self.name} measured, {self.target.split(' (')[0]}, {self.date}"

    @property
    def description(self) -> str:
        """The label with the curve's reading and the draft's cost: a report's one line."""
        return (f"{self.label} (verify {self.verify_ms[0]:.2f} ms at width 1, "
                f"{self.extension}; a draft token {self.draft_cost:.2f} of a target token)")


def _widths_text(widths: tuple[int, ...]) -> str:
    """1-9, 12, 16 ...: runs of consecutive widths joined."""
    parts, start = [], 0
    for i, a in enumerate(widths):
        if i + 1 == len(widths) or widths[i + 1] != a + 1:
            first = widths[start]
            parts.append(f"{first}-{a}" if a > first else f"{a}")
            start = i + 1
    return ", ".join(parts)


def parse(data: dict, source: str = "") -> GpuProfile:
    """A profile from its file's JSON object; a one-line error naming what is missing."""
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise ValueError(f"the GPU profile {source} lacks {', '.join(missing)}")
    return GpuProfile(**{k: data[k] for k in KEYS if k not in ("widths", "verify_ms", "draft_ms")},
                      widths=tuple(int(w) for w in data["widths"]),
                      verify_ms=tuple(float(v) for v in data["verify_ms"]),
                      draft_ms=tuple(float(d) for d in data["draft_ms"]))


def load(path: str | Path | None = None) -> GpuProfile:
    """The profile in `path` (default: the H200 run's, `PROFILE`)."""
    p = Path(path) if path is not None else PROFILE
    if not p.is_file():
        raise FileNotFoundError(f"no measured GPU profile at {p} (python -m scripts.gpu_check "
                                "profile writes one from a gpu-check run)")
    return parse(json.loads(p.read_text()), str(p))


@functools.lru_cache(maxsize=1)
def measured() -> GpuProfile:
    """The H200 run's profile, read once."""
    return load()


def available() -> GpuProfile | None:
    """The H200 run's profile where this install has it (a checkout does; a wheel, which holds
    no docs/, does not): `tandem bench` then leaves its GPU column empty and says why."""
    return measured() if PROFILE.is_file() else None
