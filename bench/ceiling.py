"""A pair's predicted ceiling on this machine, from its calibration: how fast speculation could
go over plain decoding at each gamma, for the draft model and for prompt lookup (a copy costs no
draft decode), what per-token acceptance each gamma needs just to break even, and how cheap a
draft would have to be to pay at a typical acceptance. `tandem calibrate` and the models wizard
format it; the numbers are the cost model's (engine/control/costs.py), with the draft kept in step.

With `parallel` sequences decoded together (`--parallel`), the calibration covers the widths
they reach (parallel x (gamma + 1)), and `batches` says, for a batch of 1..parallel sequences
all drafting alike at the typical acceptance, which gamma makes the batch fastest and by how
much over plain batched decoding: the figure that shrinks as the batch fills.

`reach` is the ceiling a run is set beside (the side-by-side tab): the most a copy and the draft
model could gain over plain decoding on the widths a calibration measured, every drafted token
accepted; nothing is read past its widest measured width.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.control.batch import Batch
from engine.control.costs import Calibration, CostModel, expected_tokens
from engine.drafters.base import PLAIN
from engine.errors import SettingsError
from engine.pair import Pair

# The per-token acceptance a draft model of the same family typically reaches on code after an
# answer's opening (docs/design/controller.md): where the "what would pay" figures are read.
TYPICAL_ACCEPTANCE = 0.8


@dataclass(frozen=True)
class Ceiling:
    # ms of one target decode of w tokens (index w-1), and of one draft decode.
    verify_ms: list[float]
    draft_ms: list[float]
    # The draft's cost per token relative to one target token.
    draft_relative: float
    # Speedup over plain decoding at gamma 0..max with every drafted token accepted.
    model: list[float]
    lookup: list[float]
    # Per-token acceptance at which gamma 1..max only matches plain decoding (None: never).
    model_break_even: list[float | None]
    lookup_break_even: list[float | None]
    # Speedup at gamma 0..max at TYPICAL_ACCEPTANCE.
    model_typical: list[float]
    lookup_typical: list[float]
    # The dearest draft (relative to a target token) that would still pay at some gamma at
    # TYPICAL_ACCEPTANCE on this verify curve; 0 when even a free draft would not.
    draft_must_cost_under: float
    # For a batch of 1, 2, ... `parallel` sequences (`batch_figures`).
    batches: list["BatchFigure"] = field(default_factory=list)

    @property
    def model_pays(self) -> bool:
        return max(self.model_typical[1:], default=0.0) > 1.0

    @property
    def lookup_pays(self) -> bool:
        return max(self.lookup_typical[1:], default=0.0) > 1.0

    def best(self, speeds: list[float]) -> int:
        """The gamma (>= 1) of the highest figure in `speeds`."""
        return max(range(1, len(speeds)), key=lambda g: speeds[g])


@dataclass(frozen=True)
class BatchFigure:
    sequences: int
    # A step of one row per sequence, relative to one row alone (the verify curve at that width).
    plain_cost: float
    # The gamma (0: plain) at which every sequence drafting alike makes the batch fastest at
    # TYPICAL_ACCEPTANCE, and the batch's speed then over plain batched decoding: for the draft
    # model and for prompt lookup.
    model_gamma: int
    model_speedup: float
    lookup_gamma: int
    lookup_speedup: float


def _batch_best(costs: CostModel, n: int, max_gamma: int, model_drafts: bool) -> tuple[int, float]:
    """(gamma, speedup over plain batched) of n sequences all drafting alike, the best gamma."""
    a = TYPICAL_ACCEPTANCE
    speeds = []
    for g in range(max_gamma + 1):
        e = expected_tokens(a, g)
        drafts = (g,) * (n - 1) if model_drafts and g > 0 else ()
        batch = Batch(n, (n - 1) * (g + 1), (n - 1) * e, drafts)
        # The whole step: this sequence's round and the others' draft decodes beside it.
        step = costs.step_ms(max_gamma, model_drafts, batch)[g] + costs.others_draft_ms(batch)
        speeds.append(n * e / float(step))
    best = max(range(max_gamma + 1), key=speeds.__getitem__)
    return best, round(speeds[best] / speeds[0], 3)


def batch_figures(calibration: Calibration, max_gamma: int, parallel: int) -> list[BatchFigure]:
    costs = CostModel(calibration, rate=0.0)
    out = []
    for n in range(1, parallel + 1):
        mg, ms = _batch_best(costs, n, max_gamma, True)
        lg, ls = _batch_best(costs, n, max_gamma, False)
        out.append(BatchFigure(n, round(costs.verify_cost(n) / costs.verify_cost(1), 3),
                               mg, ms, lg, ls))
    return out


def _break_even(costs: CostModel, gamma: int, model_drafts: bool) -> float | None:
    """The acceptance a at which E(a, gamma) * verify(1) equals the round's cost (bisection:
    E grows with a)."""
    need = float(costs.round_ms(gamma, model_drafts)[gamma]) / costs.verify_cost(1)
    if expected_tokens(1.0, gamma) < need:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < need else (lo, mid)
    return round(hi, 3)


def ceiling(calibration: Calibration, max_gamma: int, parallel: int = 1) -> Ceiling:
    costs = CostModel(calibration, rate=0.0)
    gammas = range(max_gamma + 1)
    one = costs.verify_cost(1)
    a = TYPICAL_ACCEPTANCE
    cheapest = max((expected_tokens(a, g) * one - costs.verify_cost(g + 1)) / (g * one)
                   for g in range(1, max_gamma + 1))
    return Ceiling(
        verify_ms=[round(v, 3) for v in calibration.verify_ms],
        draft_ms=[round(d, 3) for d in calibration.draft_ms],
        draft_relative=round(costs.draft_relative(), 4),
        model=[round(costs.speedup(g, 1.0, True), 3) for g in gammas],
        lookup=[round(costs.speedup(g, 1.0, False), 3) for g in gammas],
        model_break_even=[_break_even(costs, g, True) for g in gammas[1:]],
        lookup_break_even=[_break_even(costs, g, False) for g in gammas[1:]],
        model_typical=[round(costs.speedup(g, a, True), 3) for g in gammas],
        lookup_typical=[round(costs.speedup(g, a, False), 3) for g in gammas],
        draft_must_cost_under=round(max(cheapest, 0.0), 3),
        batches=batch_figures(calibration, max_gamma, parallel) if parallel > 1 else [])


@dataclass(frozen=True)
class Reach:
    """The most speculation could gain over plain decoding on a calibration's verify curve,
    every drafted token accepted: a copy (no draft decode) at its best length, and the draft
    model at its best gamma (None without a draft model in the calibration)."""
    copy_gamma: int
    copy: float
    model_gamma: int | None
    model: float | None

    @property
    def best(self) -> float:
        return max(self.copy, self.model or 0.0)


def reach(calibration: Calibration, copy_gamma: int, model_gamma: int) -> Reach:
    """`Reach` of copies up to `copy_gamma` tokens and the draft model up to `model_gamma`,
    each cut to the widths the calibration covers (a round of g verifies g + 1); the best gamma
    of 1 and up, whether or not it beats plain (gamma 0 and 1.0 where none is allowed).

    >>> r = reach(Calibration([0.3] * 4, [1.0, 1.9, 2.0, 2.5]), 64, 8)
    >>> (r.copy_gamma, r.copy, r.model_gamma, r.model)
    (3, 1.6, 3, 1.176)
    """
    costs = CostModel(calibration, rate=0.0)
    widest = len(calibration.verify_ms) - 1

    def best(most: int, model_drafts: bool) -> tuple[int, float]:
        speeds = {g: costs.speedup(g, 1.0, model_drafts) for g in range(1, min(most, widest) + 1)}
        if not speeds:
            return 0, 1.0
        g = max(speeds, key=speeds.__getitem__)
        return g, round(speeds[g], 3)

    cg, c = best(copy_gamma, False)
    if not any(calibration.draft_ms):
        return Reach(cg, c, None, None)
    mg, m = best(model_gamma, True)
    return Reach(cg, c, mg, m)


def calibration_gamma(max_gamma: int, parallel: int) -> int:
    """The gamma whose calibration covers the widest step of `parallel` sequences drafting
    `max_gamma` each (a calibration to gamma g measures widths 1..g + 1).

    >>> calibration_gamma(8, 1), calibration_gamma(8, 4)
    (8, 35)
    """
    return parallel * (max_gamma + 1) - 1


def measure(pair: Pair, max_gamma: int = 8, parallel: int = 1) -> Ceiling:
    """Calibrate a loaded pair (its default drafter's models; lookup alone without a draft) to
    the widths `parallel` sequences reach, and return its ceiling. Caches are left as they
    were."""
    if parallel < 1:
        raise SettingsError(f"parallel sequences must be at least 1, got {parallel}")
    drafter = pair.default_drafter if pair.default_drafter != PLAIN else "lookup"
    cal = pair.calibration(drafter, calibration_gamma(max_gamma, parallel))
    return ceiling(cal, max_gamma, parallel)
