"""What a speculative round costs: a pair's measured decode times (`calibrate`, a few real
decodes at some widths, rolled back, interpolated between them: a `Calibration`, kept across
processes by loading/calibrations.py) and the cost model the adaptive controller prices rounds
with, refined from every round's measured times.

A round drafting g tokens costs
  C(g) = verify(g + 1) + [g > 0 and the draft model drafts] * (g * draft_token + catch_up(lag))
where verify(w) is a target decode of w tokens (read at the width it is padded to,
engine/widths.py), draft_token one draft decode, and catch_up(lag) the extra cost of the draft's
first decode when it must first swallow `lag` committed tokens it has not seen. A copy (from the
context or the history) costs its verify alone. `round_cost` is that formula, element-wise over
gammas: the controller prices every gamma of a round with it, and the benchmark's closed forms
(bench/benchmark/theory.py) apply it to costs in units of a target token.

In a batch (engine/control/batch.py) the round shares one step with the other sequences, which
put W_o rows into the target's decode and expect to commit T_o tokens. The step takes
  R(g) = verify(W_o + g + 1) + [g > 0 and the draft model drafts] * (sum_{d <= g} d_b(d) + catch_up)
where the draft term is what each depth of this draft adds to the others' draft batch there
(`batch_draft_ms`: a whole draft decode past the others' depths), and the batch commits
T_o + E(g) tokens in it. Drafting g is worth what it does to the batch's speed
(T_o + E(g)) / R(g): this round's tokens against the time every sequence waits for its rows, not
against its marginal cost alone (on a GPU an extra row is nearly free, but not to the others once
the step's width passes the flat part of the curve). So in a batch the controller compares
(T_o + E(g)) / R(g) over g where alone it compares E(g) / C(g), and a gamma pays when the batch's
tokens at a plain step's pace, (T_o + E(g)) * R(0) / (T_o + 1), would take longer than R(g);
alone (W_o = T_o = 0) R is C, and is computed the old way.

Answering the others as they are is not enough: a batch can settle where every sequence drafts
because the others do (a depth's draft decode is one call, nearly as dear for one draft as for
all of them, so leaving it alone saves little), slower than every sequence decoding plainly.
On the measured H200 profile four sequences drafting 1 each through a draft at 0.50 of a target
token, at acceptance 0.8, made 603.5 tokens/s where plain batched made 610.7. So a gamma in a
batch must also beat the batch decoding plainly, n tokens in verify(n): the batch's tokens at
that pace, (T_o + E(g)) * verify(n) / n, would take longer than the whole step, R(g) + D_o,
where D_o is the others' draft batches, one per depth (`others_draft_ms`), which every
sequence's target part waits out (engine/batch_step.py). Any step that settles with drafting
is then at least as fast as plain batched decoding by the controller's own prediction
(tests/test_batch_replay.py). Worked example, costs in plain tokens, a copy at acceptance 0.8
(E(g) = 1, 1.8, 2.44, 2.95, 3.36), on a curve flat to 4 rows then 0.5 a row:
- alone: C(g) = 1, 1, 1, 1, 1.5: speeds 1, 1.8, 2.44, 2.95, 2.24 tokens a unit: gamma 3;
- batch of 2, the other drafting 1 (W_o = 2, T_o = 1.8): R(g) = 1, 1, 1.5, 2: the batch's speed
  (1.8 + E(g)) / R(g) = 2.8, 3.6, 2.83, 2.38: gamma 1, a step of width 4, faster than the
  batch plain (2 tokens a unit);
- batch of 4, three others drafting 1 (W_o = 6, T_o = 5.4): R(g) = 2.5, 3: (5.4 + E(g)) / R(g)
  = 2.56, 2.4: the drafted row slows three sequences more than its 0.8 token gains, so plain
  ("plain: batch of 4: drafting cannot pay at width 7"); the batch plain, 4 tokens a unit, is
  faster than either, and the others, asking the same, stop drafting too.
"""
from __future__ import annotations

import numpy as np

from dataclasses import dataclass
from typing import Mapping, Sequence, cast

import numpy.typing as npt

from engine.clock import Clock, wall_ms
from engine.control.batch import Batch
from engine.errors import SettingsError
from engine.generation_config import COPY_MAX
from engine.machine_load import Load, no_load
from engine.session import Session
from engine.widths import padded_width


# The widths a calibration times the target at, up to the widest it is asked for (which it always
# times): every width to 9, where the CPU's batch kernels make neighbours differ most
# (engine/widths.py), then sparser as the curve straightens, to the 64 tokens a copy drafts (and
# its verify of 65). Between them a cost is interpolated (`dense`). Tiled kernels make a width
# that fills whole tiles cheaper than both its neighbours, so each multiple of 16 is timed with
# the widths either side of it, and the multiple of 8 between: measured at every width on a Zen 4
# (issue 62, 2 threads, target tokens), 15/16/17 cost 9.90/7.97/9.13, 31/32/33 16.9/15.0/17.9,
# 47/48/49 21.9/19.2/21.8 and 63/64 28.2/25.4. Interpolated over 16, 24, 32 alone, a verify of 31
# was priced at 11.2 where it took 15.2, so copies were drafted to widths that cost a third more
# than their price, and never padded to the cheaper 32.
VERIFY_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 40, 47, 48, 49, 56,
                 63, 64)
# The draft model decodes its drafts a token at a time (at most the adaptive maximum, 8, a
# round, with one row per slot drafting at that depth) and catches up on what it has not seen
# in one batch: every width to 9, and 12 and 16 for the catch-up after a long copy. Past 16 its
# costs go on at the 12-to-16 pace (a prefill's); it is never timed at 64.
DRAFT_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
# A calibration is not the machine's when other programs took more than this share of its CPUs
# while it ran, or when its sweeps' median width took this much longer than its best.
BUSY_SHARE = 0.25
BUSY_SPREAD = 0.25


def sparse_widths(widths: Sequence[int], widest: int) -> list[int]:
    """The widths of `widths` below `widest`, then `widest`.

    >>> sparse_widths(VERIFY_WIDTHS, 20), sparse_widths(DRAFT_WIDTHS, 3)
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 20], [1, 2, 3])
    """
    return [w for w in widths if w < widest] + [widest]


def dense(points: Mapping[int, float], n: int) -> list[float]:
    """Costs at widths 1..n from the costs measured at `points` (width: ms, width 1 among
    them): piecewise linear between measured widths, and past the widest at the pace of its last
    two (never falling).

    >>> dense({1: 1.0, 2: 2.0, 4: 3.0}, 6)
    [1.0, 2.0, 2.5, 3.0, 3.5, 4.0]
    """
    widths = sorted(points)
    if not widths or widths[0] != 1:
        raise SettingsError("a calibration needs the cost of a decode of one token")
    costs = [float(points[w]) for w in widths]
    inside = [float(c) for c in np.interp(range(1, min(n, widths[-1]) + 1), widths, costs)]
    if n <= widths[-1]:
        return inside
    pace = (max(costs[-1] - costs[-2], 0.0) / (widths[-1] - widths[-2])
            if len(widths) > 1 else costs[-1])
    return inside + [costs[-1] + pace * (w - widths[-1]) for w in range(widths[-1] + 1, n + 1)]


@dataclass(frozen=True)
class Calibration:
    """A drafter's measured decode costs: a value, made once by `calibrate` (or restored from
    where it was kept, loading/calibrations.py) and never changed. What controllers learn from
    it is the drafter's evidence (engine/control/evidence.py), which the pair keeps beside it
    (engine/knowledge.py)."""
    # Index w-1 holds the cost in ms of one decode of w tokens, at every width to the widest
    # measured (kept as tuples, whatever sequence is given): measured at `verify_widths` and
    # `draft_widths`, interpolated between them (`from_points`); the draft's table is as long
    # as the target's. Empty widths: every width was measured.
    draft_ms: Sequence[float]
    verify_ms: Sequence[float]
    # The name of the drafter's part whose decodes `draft_ms` times (`Drafter.model_name`), for
    # reports only: which part drafts a round is the round's plan (`RoundPlan.source`), never
    # matched by name.
    model_name: str | None = None
    verify_widths: Sequence[int] = ()
    draft_widths: Sequence[int] = ()
    # Why these figures are not the machine's pace (other programs shared the CPUs while they
    # were taken), in words; empty when nothing was seen. Such a calibration serves the process
    # that took it and is not kept for the next (loading/calibrations.py).
    busy: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "draft_ms", tuple(float(d) for d in self.draft_ms))
        object.__setattr__(self, "verify_ms", tuple(float(v) for v in self.verify_ms))
        for name in ("verify_widths", "draft_widths"):
            object.__setattr__(self, name, tuple(int(w) for w in getattr(self, name)))

    @classmethod
    def from_points(cls, verify: Mapping[int, float], draft: Mapping[int, float] | None,
                    model_name: str | None = None, busy: str = "") -> "Calibration":
        """The calibration of the costs measured at some widths (width: ms): the target's to its
        widest, the draft's (None: no draft model) read at as many."""
        n = max(verify)
        verify_ms = dense(verify, n)
        draft_ms = dense(draft, n) if draft else [0.0] * n
        return cls(draft_ms=draft_ms, verify_ms=verify_ms, model_name=model_name,
                   verify_widths=sorted(verify), draft_widths=sorted(draft or ()), busy=busy)

    def points(self) -> tuple[dict[int, float], dict[int, float]]:
        """The measured costs, target's and draft's (width: ms; the draft's empty without a
        draft model)."""
        vw = self.verify_widths or range(1, len(self.verify_ms) + 1)
        dw = self.draft_widths or (range(1, len(self.draft_ms) + 1) if any(self.draft_ms)
                                   else ())
        return ({w: self.verify_ms[w - 1] for w in vw}, {w: self.draft_ms[w - 1] for w in dw})

    def covers(self, widest: int) -> bool:
        """Whether it was measured at every width `calibrate` times below `widest` (or at every
        width), so that one kept by a build that timed fewer widths is measured again.

        >>> Calibration.from_points({1: 1.0, 16: 8.0, 24: 12.0}, None).covers(9)
        False
        >>> Calibration([0.0] * 3, [1.0, 2.0, 3.0]).covers(3)
        True
        """
        measured = set(self.verify_widths)
        return not measured or all(w in measured for w in VERIFY_WIDTHS if w < widest)

    def as_kwargs(self) -> dict:
        return {"draft_ms": self.draft_ms, "verify_ms": self.verify_ms,
                "model_name": self.model_name}


@dataclass(frozen=True)
class Sweeps:
    """Best-of-sweeps decode times at some widths, and how far the sweeps disagreed: the median
    over widths of each width's median sweep over its best."""
    best: dict[int, float]
    spread: float


def _timed_widths(session: Session, widths: Sequence[int], context: Sequence[int], reps: int,
                  all_rows: bool, clock: Clock) -> Sweeps:
    base = session.n_past
    tokens = [int(t) for t in context]
    if not tokens:
        raise SettingsError("calibration needs a non-empty context")
    max_width = max(widths)
    try:
        if base == 0:
            session.extend(tokens)
        start = session.n_past
        filler = (tokens * (max_width // len(tokens) + 1))[:max_width]
        # The first decode after load pays one-off allocations: keep it out of the numbers.
        session.extend(filler[:1])
        session.rollback(start)
        times: dict[int, list[float]] = {w: [] for w in widths}
        # Sweeps over every width, the best of `reps` sweeps: a spell of load from another
        # program then slows one sweep's widths alike instead of one width's every try.
        for _ in range(reps):
            for w in widths:
                t0 = clock()
                session.extend(filler[:w], rows=range(w) if all_rows else None)
                times[w].append(clock() - t0)
                session.rollback(start)
        best = {w: min(t) for w, t in times.items()}
        spread = float(np.median([np.median(t) / best[w] - 1.0 if best[w] > 0 else 0.0
                                  for w, t in times.items()]))
        return Sweeps(best, spread)
    finally:
        session.rollback(base)


def busy_line(others: float | None, spread: float) -> str:
    """Why a calibration is not the machine's pace, in words ("" when it is).

    >>> busy_line(0.4, 0.05)
    'the machine was busy while calibrating: other programs used 40% of its CPUs'
    >>> busy_line(None, 0.1)
    ''
    """
    said = []
    if others is not None and others > BUSY_SHARE:
        said.append(f"other programs used {others:.0%} of its CPUs")
    if spread > BUSY_SPREAD:
        said.append(f"its timings of one width differed by {spread:.0%}")
    return "the machine was busy while calibrating: " + ", ".join(said) if said else ""


def calibrate(target: Session, draft: Session | None, max_gamma: int, context: Sequence[int],
              reps: int = 4, model_name: str | None = None,
              clock: Clock = wall_ms, load: Load = no_load) -> Calibration:
    """Time target decodes (all rows, as verification needs) at the widths of VERIFY_WIDTHS up
    to max_gamma + 1 and draft decodes at those of DRAFT_WIDTHS, and say whether the machine was
    busy meanwhile (`load`, engine/machine_load.py, and the sweeps' spread); every cache is left
    holding exactly what it held before."""
    width = max_gamma + 1
    span = load()
    verify = _timed_widths(target, sparse_widths(VERIFY_WIDTHS, width), context, reps,
                           all_rows=True, clock=clock)
    spread = verify.spread
    drafted: dict[int, float] | None = None
    if draft is not None:
        d = _timed_widths(draft, sparse_widths(DRAFT_WIDTHS, min(width, DRAFT_WIDTHS[-1])),
                          context, reps, all_rows=False, clock=clock)
        drafted, spread = d.best, max(spread, d.spread)
    return Calibration.from_points(verify.best, drafted,
                                   model_name=model_name if draft is not None else None,
                                   busy=busy_line(span(), spread))


def at_width(table: Sequence[float], w: int) -> float:
    """table[w-1], extrapolated linearly past the measured widths."""
    if w <= len(table):
        return float(table[w - 1])
    step = table[-1] - table[-2] if len(table) > 1 else table[-1]
    return float(table[-1] + max(step, 0.0) * (w - len(table)))


def round_cost(verify: npt.ArrayLike, gamma: npt.ArrayLike, draft_token: float,
               catch_up: npt.ArrayLike = 0.0) -> np.ndarray:
    """C(g) = verify(g + 1) + [g > 0] * (g * draft_token + catch_up), element-wise: `verify`
    holds verify(g + 1) for each g; a copy's round has draft_token = catch_up = 0. In ms, or in
    units of a plain token for the closed forms.

    >>> round_cost([1.0, 1.25, 1.5], [0, 1, 2], 0.25, 0.5).tolist()
    [1.0, 2.0, 2.5]
    """
    g = np.asarray(gamma, dtype=np.float64)
    share = np.asarray(catch_up, dtype=np.float64)
    return np.asarray(verify, dtype=np.float64) + (g * draft_token + share) * (g > 0)


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Tokens a round drafting `gamma` commits when each drafted token is accepted with
    probability `acceptance` given the earlier ones were."""
    return float(sum(acceptance ** i for i in range(gamma + 1)))


def _at(table: np.ndarray, w: int) -> float:
    """`at_width` of one of the cost model's arrays."""
    return at_width(cast(Sequence[float], table), w)


class CostModel:
    """Round costs in ms from a calibration; `learn_*` move them towards measured rounds."""

    def __init__(self, calibration: Calibration, rate: float) -> None:
        c = calibration
        if not c.verify_ms or len(c.draft_ms) != len(c.verify_ms) or min(c.verify_ms) <= 0:
            raise SettingsError("calibration must give positive verify costs and a draft cost "
                                "for each width")
        self.rate = rate
        # Arrays, so that a plain round's step (every cost alike) is one multiplication each.
        self.verify = np.array(c.verify_ms, dtype=np.float64)
        self.draft_batch = np.array(c.draft_ms, dtype=np.float64)
        # The pair pads batches to the cheaper widths of its calibration (engine/widths.py);
        # costs are read at the width actually decoded, which is fixed by the calibration.
        self.pad_verify = [float(v) for v in c.verify_ms]
        self.pad_draft = [float(d) for d in c.draft_ms]
        self._padded = [padded_width(self.pad_verify, w) for w in range(1, len(self.verify) + 1)]
        self._padded_draft = [padded_width(self.pad_draft, w)
                              for w in range(1, len(self.draft_batch) + 1)]
        self.draft_token = float(self.draft_batch[0])
        # verify_costs' answer for every width priced so far (at least the calibration's), kept
        # up to date as costs are learned: the controller prices every gamma of every round
        # from it, a copy at its own length (up to 64 tokens), so it is sliced, not rebuilt.
        self._verify_costs: np.ndarray | None = None
        # Bumped whenever the verify curve changes shape (a wide round's measurement): what
        # only the curve's ratios decide may be kept until then.
        self.shape = 0
        # Bumped whenever a draft token's cost moves against the verify curve (a model round's
        # measurement): what the model's round costs' ratios decide may be kept until then.
        self.draft_shape = 0
        self._gammas = np.arange(COPY_MAX + 1, dtype=np.float64)

    def verify_costs(self, n: int) -> np.ndarray:
        """`verify_cost(w)` for w = 1..n, as an array (a view: not to be written to)."""
        cached = self._verify_costs
        if cached is None or len(cached) < n:
            widest = max(n, len(self._padded), len(cached) if cached is not None else 0)
            cached = self._verify_costs = np.array([self.verify_cost(w)
                                                    for w in range(1, widest + 1)])
        return cached[:n]

    def verify_cost(self, width: int) -> float:
        """Expected cost of verifying a batch of `width` tokens, at the width it is decoded."""
        padded = self._padded
        return _at(self.verify, padded[width - 1] if 0 < width <= len(padded) else width)

    def catch_up_ms(self, lag: int) -> float:
        """The extra cost of a draft decode that first feeds `lag` - 1 committed tokens."""
        if lag <= 1:
            return 0.0
        padded = self._padded_draft
        wide = _at(self.draft_batch, padded[lag - 1] if lag <= len(padded) else lag)
        return max(wide - _at(self.draft_batch, 1), 0.0)

    def round_ms(self, max_gamma: int, model_drafts: bool,
                 catch_up: npt.ArrayLike = 0.0) -> np.ndarray:
        """`round_cost` of rounds drafting 0..max_gamma: their verify, plus when the draft model
        drafts its decodes and the share of its catch-up charged to each."""
        verify = self.verify_costs(max_gamma + 1)
        if not model_drafts:
            return verify
        # round_cost's formula, in as few array operations as a round's pricing allows.
        ms = verify + self._gammas[:max_gamma + 1] * self.draft_token
        if np.ndim(catch_up) == 0:
            ms[1:] += float(np.asarray(catch_up))
            return ms
        share = np.array(catch_up, dtype=np.float64)
        share[..., 0] = 0.0
        return ms + share

    def step_ms(self, max_gamma: int, model_drafts: bool, batch: Batch,
                catch_up: npt.ArrayLike = 0.0) -> np.ndarray:
        """R(g), the whole step's time when this sequence drafts g = 0..max_gamma and the others
        put `batch` into it: the target decode at the step's total width, and this sequence's
        draft decodes at what they add to the others' draft batches. Those batches themselves,
        D_o, the same for every g, are left out (`others_draft_ms`; only the test against the
        batch decoding plainly adds them): with them in, each sequence compares its gammas at a
        slower step, and on a flat curve the draft model's batches kept every depth the others
        drafted (8 sequences at gamma 6, 1176 tokens/s, where leaving them out settles at 5 and
        4, 1217)."""
        w = batch.width
        verify = np.array([self.verify_cost(v) for v in range(w, w + max_gamma + 1)])
        if not model_drafts:
            return verify
        depths = np.array([self.batch_draft_ms(batch, d) for d in range(1, max_gamma + 1)])
        drafts = np.concatenate(([0.0], np.cumsum(depths)))
        share = np.asarray(catch_up, dtype=np.float64)
        return verify + drafts + share * (self._gammas[:max_gamma + 1] > 0)

    def others_draft_ms(self, batch: Batch) -> float:
        """D_o, the other sequences' draft decodes in the step, which every sequence's target
        part waits out (engine/batch_step.py): one draft batch per depth, as wide as the drafts
        reaching it (at the learned pace, as `batch_draft_ms`)."""
        deepest = max(batch.other_drafts, default=0)
        if not deepest:
            return 0.0
        db = self.draft_batch
        if db[0] <= 0:
            return 0.0
        rows = sum(_at(db, batch.drafting_at(d)) for d in range(1, deepest + 1))
        return self.draft_token * rows / float(db[0])

    def batch_draft_ms(self, batch: Batch, depth: int) -> float:
        """What this sequence's draft decode at `depth` adds to the step: a whole draft decode
        where no other draft reaches that depth, else the widening of the others' batch there
        from k to k + 1 rows (at the learned pace: `draft_token` over the calibrated width-1
        cost)."""
        k = batch.drafting_at(depth)
        if k == 0:
            return self.draft_token
        db = self.draft_batch
        wider = max(_at(db, k + 1) - _at(db, k), 0.0)
        return self.draft_token * wider / db[0] if db[0] > 0 else 0.0

    def draft_relative(self) -> float:
        """The draft model's cost per token relative to one target token."""
        return self.draft_token / self.verify[0]

    def speedup(self, gamma: int, acceptance: float, model_drafts: bool) -> float:
        """Predicted speed of rounds drafting `gamma` over plain decoding, at a per-token
        acceptance, the draft kept in step (no catch-up)."""
        return (expected_tokens(acceptance, gamma) * self.verify_cost(1)
                / float(self.round_ms(gamma, model_drafts)[gamma]))

    def learn_draft(self, draft_ms: float, proposed: int, lag: int) -> None:
        """A model round drafted `proposed` tokens in `draft_ms`, after a lag of `lag`."""
        per_token = max(draft_ms - self.catch_up_ms(lag), 0.0) / proposed
        self.draft_token += self.rate * (per_token - self.draft_token)
        self.draft_shape += 1

    def learn_verify(self, width: int, measured: float) -> None:
        self.verify = np.asarray(self.verify, dtype=np.float64)
        if len(self.verify) < width:
            self.verify = np.append(self.verify, [_at(self.verify, w) for w in
                                                  range(len(self.verify) + 1, width + 1)])
        ratio = measured / self.verify[width - 1]
        if width == 1:
            # A plain round measures the machine's pace: load (another program, heat) slows
            # every decode alike, the draft's too, so all costs take the same step and their
            # ratios, which choose gamma, stay as calibrated.
            common = 1.0 + self.rate * (ratio - 1.0)
            self.verify = self.verify * common
            self.draft_token *= common
            self.draft_batch = self.draft_batch * common
            if self._verify_costs is not None:
                self._verify_costs = self._verify_costs * common
            return
        self._verify_costs = None
        self.shape += 1
        # A wide verify also learns the curve's shape: the width seen moves fully, the others
        # follow a fraction.
        steps = np.full(len(self.verify), self.rate / 4)
        steps[width - 1] = self.rate
        self.verify = self.verify * (1.0 + steps * (ratio - 1.0))
