"""The adaptive controller: each round, the gamma (0 = plain decoding) that maximises expected
committed tokens per second, from measured costs and acceptance tracked online.

Model of one round drafting g tokens:
  expected tokens  E(g) = sum_{i=0..g} prod_{j<i} a_j   (accepted prefix + the target's token)
  cost             C(g) = verify(g + 1) + [g > 0] * (g * draft_token + catch_up(lag))
where a_j is the acceptance rate at draft position j given the earlier ones were accepted,
verify(w) is a target decode of w tokens, and catch_up(lag) is the extra cost of the draft
model's first decode when it must first swallow `lag` committed tokens it has not seen (after
plain rounds, or rounds another drafter filled). Costs come from `calibrate` (a few real
decodes at load, rolled back) and are refined from every round's measured times; acceptance
counts decay so the estimates follow easy and hard stretches of text. While plain decoding
wins, a small probe round now and then (at growing intervals while probes keep losing) lets
speculation come back when the text turns predictable. Probes are the controller's own cost
when speculation loses (each pays the draft's catch-up), so they are rare, and a gamma must be
predicted to beat plain decoding by `margin` before it is used (by `resume_margin` to start
again after plain rounds).

Plain rounds still say how predictable the text is: the target's top probability at the token it
commits. Over 18 suite prompts the 0.5B draft's greedy agreement with the 1.5B target tracked it
closely (0.99 where the target was above 0.97 sure, 0.61 at 0.5-0.7, 0.27 at 0.3-0.5;
research/measure_costs.py agree). So every plain round adds a pseudo-observation `conf_weight *
scale * confidence` to the acceptance counts, where `scale` (acceptance per unit of confidence)
is learned from the rounds that did draft. This lets speculation resume on its own when the text
turns predictable, without waiting for a probe. A resumption pays the draft's catch-up once and
then speculates for several rounds, so that cost is spread over the rounds the answer so far
would fill (at least `horizon`) when choosing gamma.

Gamma is the most a round may draft; the draft model stops earlier when its own probabilities
say the run is unlikely to survive (`chain_min` in engine/drafters/draft_model.py), and
`keep_drafting` stops it when the next token is not worth its verify width and draft decode.
Both are stopping rules that read only what comes before the token they decide on, which is
what keeps the output exact (docs/EXACTNESS.md). Three plain opening rounds (`opening_plain`)
let the target show how predictable an answer's start is before the first draft
(docs/BENCHMARKS.md has the measurements behind these choices).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.clock import Clock, wall_ms
from engine.errors import SettingsError
from engine.policy import GammaPolicy
from engine.session import Session
from engine.stats import RoundStats
from engine.widths import padded_width


@dataclass
class Calibration:
    # Index w-1 holds the cost in ms of one decode of w tokens.
    draft_ms: list[float]
    verify_ms: list[float]
    # Proposal.source of the rounds in which the draft model resynchronises its cache.
    model_source: str | None = None
    # Proposal.source of the rounds that copy from the context (prompt lookup): they cost no
    # draft decode and no catch-up, and keep acceptance counts of their own.
    copy_source: str | None = None

    def as_kwargs(self) -> dict:
        return {"draft_ms": self.draft_ms, "verify_ms": self.verify_ms,
                "model_source": self.model_source, "copy_source": self.copy_source}


def _timed_widths(session: Session, max_width: int, context: Sequence[int], reps: int,
                  all_rows: bool, clock: Clock) -> list[float]:
    base = session.n_past
    tokens = [int(t) for t in context]
    if not tokens:
        raise SettingsError("calibration needs a non-empty context")
    try:
        if base == 0:
            session.extend(tokens)
        start = session.n_past
        filler = (tokens * (max_width // len(tokens) + 1))[:max_width]
        # The first decode after load pays one-off allocations: keep it out of the numbers.
        session.extend(filler[:1])
        session.rollback(start)
        out = []
        for w in range(1, max_width + 1):
            best = float("inf")
            for _ in range(reps):
                t0 = clock()
                session.extend(filler[:w], rows=range(w) if all_rows else None)
                best = min(best, clock() - t0)
                session.rollback(start)
            out.append(best)
        return out
    finally:
        session.rollback(base)


def calibrate(target: Session, draft: Session | None, max_gamma: int, context: Sequence[int],
              reps: int = 2, model_source: str | None = None,
              clock: Clock = wall_ms, copy_source: str | None = None) -> Calibration:
    """Time target decodes of 1..max_gamma+1 tokens (all rows, as verification needs) and draft
    decodes of as many; every cache is left holding exactly what it held before."""
    width = max_gamma + 1
    verify_ms = _timed_widths(target, width, context, reps, all_rows=True, clock=clock)
    draft_ms = (_timed_widths(draft, width, context, reps, all_rows=False, clock=clock)
                if draft is not None
                else [0.0] * width)
    return Calibration(draft_ms=draft_ms, verify_ms=verify_ms,
                       model_source=model_source if draft is not None else None,
                       copy_source=copy_source)


def _at(table: Sequence[float], w: int) -> float:
    """table[w-1], extrapolated linearly past the measured widths."""
    if w <= len(table):
        return float(table[w - 1])
    step = table[-1] - table[-2] if len(table) > 1 else table[-1]
    return float(table[-1] + max(step, 0.0) * (w - len(table)))


class AdaptiveController(GammaPolicy):
    """Without costs at construction it is uncalibrated; `Pair.generate` supplies the pair's
    cached calibration via `use_calibration` before the first round."""

    def __init__(self, max_gamma: int = 8, draft_ms: Sequence[float] | None = None,
                 verify_ms: Sequence[float] | None = None, model_source: str | None = None,
                 copy_source: str | None = None, prior: float = 0.7,
                 prior_weight: float = 2.0, decay: float = 0.9,
                 rate: float = 0.2, margin: float = 0.05, probe_every: int = 64,
                 probe_max: int = 256, probe_gamma: int = 2, conf_weight: float = 0.5,
                 scale_prior_weight: float = 8.0, horizon: float = 4.0,
                 horizon_cap: float = 256.0,
                 resume_margin: float = 0.15, opening_plain: int = 3) -> None:
        if max_gamma < 1:
            raise SettingsError(f"the adaptive controller needs max gamma >= 1, got {max_gamma}")
        if opening_plain < 0:
            raise SettingsError(f"plain opening tokens must be >= 0, got {opening_plain}")
        self.name = "adaptive"
        self.max_gamma = max_gamma
        self.model_source = model_source
        self.copy_source = copy_source
        # Whether the round being chosen copies from the context (engine/drafters/hybrid.py).
        self.copying = False
        self.verify: list[float] = []
        self.draft_batch: list[float] = []
        self.pad_verify: list[float] = []
        self.pad_draft: list[float] = []
        self.draft_token = 0.0
        if verify_ms is not None:
            self.use_calibration(Calibration(list(draft_ms if draft_ms is not None
                                                  else [0.0] * len(verify_ms)),
                                             list(verify_ms), model_source, copy_source))
        self.prior, self.prior_weight, self.decay, self.rate = prior, prior_weight, decay, rate
        self.margin = margin
        self.resume_margin = max(resume_margin, margin)
        self.speculating = False
        self.tries = np.zeros(max_gamma, dtype=np.float64)
        self.hits = np.zeros(max_gamma, dtype=np.float64)
        self.copy_tries = np.zeros(max_gamma, dtype=np.float64)
        self.copy_hits = np.zeros(max_gamma, dtype=np.float64)
        # Tokens committed that the draft model has not decoded yet; 1 after prefill.
        self.lag = 1
        self.probe_every, self.probe_max, self.probe_gamma = probe_every, probe_max, probe_gamma
        self.interval = probe_every
        self.zero_run = 0
        self.rounds = 0
        self.probing = False
        self.last_prediction: float | None = None
        # The generator reports the target's confidence per verified row to policies that ask.
        self.wants_confidence = True
        self.conf_weight, self.horizon, self.horizon_cap = conf_weight, horizon, horizon_cap
        self.elapsed = 0
        self.opening_plain = opening_plain
        self.scale_prior_weight = scale_prior_weight
        self.scale_hits = 0.0
        self.scale_conf = 0.0

    @property
    def calibrated(self) -> bool:
        return bool(self.verify)

    def use_calibration(self, calibration: Calibration) -> None:
        c = calibration
        if not c.verify_ms or len(c.draft_ms) != len(c.verify_ms) or min(c.verify_ms) <= 0:
            raise SettingsError("calibration must give positive verify costs and a draft cost "
                                "for each width")
        self.verify = [float(v) for v in c.verify_ms]
        self.draft_batch = [float(d) for d in c.draft_ms]
        # The pair pads batches to the cheaper widths of its calibration (engine/widths.py);
        # costs are read at the width actually decoded.
        self.pad_verify = list(self.verify)
        self.pad_draft = list(self.draft_batch)
        self.draft_token = self.draft_batch[0]
        self.model_source = c.model_source
        self.copy_source = c.copy_source

    def _counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(tries, hits) per draft position of the source drafting this round."""
        return (self.copy_tries, self.copy_hits) if self.copying else (self.tries, self.hits)

    def acceptance(self) -> list[float]:
        """Estimated a_j per draft position, shrunk towards the pooled rate where data is thin."""
        tries, hits = self._counts()
        pooled = ((hits.sum() + self.prior_weight * self.prior)
                  / (tries.sum() + self.prior_weight))
        return list((hits + self.prior_weight * pooled) / (tries + self.prior_weight))

    def expected_tokens(self, gamma: int) -> float:
        a = self.acceptance()
        return float(1.0 + np.sum(np.cumprod(a[:gamma])))

    def catch_up_ms(self, lag: int) -> float:
        if lag <= 1:
            return 0.0
        wide = _at(self.draft_batch, padded_width(self.pad_draft, lag))
        return max(wide - _at(self.draft_batch, 1), 0.0)

    def verify_cost(self, width: int) -> float:
        """Expected cost of verifying a batch of `width` tokens, at the width it is decoded."""
        return _at(self.verify, padded_width(self.pad_verify, width))

    def _rounds_ahead(self, expected: float) -> float:
        """Rounds over which a resumption's catch-up is spread: at least `horizon`, and as many
        as the answer so far would fill (up to `horizon_cap` tokens). The length so far is the
        only guess of what remains (half the time an answer goes on at least as long again, by
        Gott's rule); early in an answer it may be about to end, so resuming must pay quickly.
        With a fixed horizon, a long plain stretch made the catch-up grow with the lag until
        resuming never looked worth it (scripts/policy_sim.py: codegen-01 stayed plain for its
        last 55 tokens, 0.99x; with this, 1.20x)."""
        if self.horizon_cap <= 0:
            return self.horizon
        return max(self.horizon, min(self.elapsed, self.horizon_cap) / expected)

    def cost_ms(self, gamma: int, expected: float | None = None) -> float:
        """Expected ms of a round drafting `gamma`; `expected` is its expected tokens, when the
        caller has it already."""
        cost = self.verify_cost(gamma + 1)
        if gamma > 0 and not self.copying:
            if expected is None:
                expected = self.expected_tokens(gamma)
            catch_up = self.catch_up_ms(self.lag) / self._rounds_ahead(expected)
            cost += gamma * self.draft_token + catch_up
        return cost

    @property
    def scale(self) -> float:
        """Acceptance per unit of target confidence, shrunk towards 1 where data is thin."""
        return ((self.scale_hits + self.scale_prior_weight)
                / (self.scale_conf + self.scale_prior_weight))

    def predicted_tps(self, gamma: int) -> float:
        return 1e3 * self.expected_tokens(gamma) / self.cost_ms(gamma)

    def _speeds(self) -> np.ndarray:
        """predicted_tps for every gamma 0..max_gamma, with one acceptance estimate."""
        expected = np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(self.acceptance()))))
        costs = [self.cost_ms(g, float(expected[g])) for g in range(self.max_gamma + 1)]
        return 1e3 * expected / np.array(costs)

    def best_gamma(self, speeds: np.ndarray | None = None) -> int:
        """The gamma to use, from `speeds` (predicted_tps of every gamma; computed when not
        given)."""
        if speeds is None:
            speeds = self._speeds()
        g = int(np.argmax(speeds[1:])) + 1
        # Hysteresis: starting to speculate again is a bet on an estimate partly made of the
        # target's confidence, and a lost round costs about two target tokens, so it needs a
        # larger predicted gain than carrying on does.
        margin = self.margin if self.speculating else self.resume_margin
        return g if speeds[g] > speeds[0] * (1.0 + margin) else 0

    def could_win(self) -> bool:
        """Whether any gamma would beat plain decoding if every drafted token were accepted;
        when not, probing can only lose."""
        plain = self.predicted_tps(0) * (1.0 + self.margin)
        return any(1e3 * (g + 1) / self.cost_ms(g) > plain for g in range(1, self.max_gamma + 1))

    def keep_drafting(self, own: Sequence[float], sure: float, limit: int,
                      fixed_width: bool) -> bool:
        """Before the draft draws token k = len(own): draw it when some round of m tokens,
        k < m <= limit, is worth more than stopping at k. A token counts as accepted with the
        draft's own probability (of the tokens drawn, then `sure` for each further one); a
        round's worth is its expected accepted tokens less its extra verify width and draft
        decodes, in target tokens (the draft's row for token k is paid for already)."""
        one = self.verify[0]
        k = len(own)

        def width(m: int) -> int:
            return limit + 1 if fixed_width and m > 0 else m + 1

        chain = float(np.prod(own)) if k else 1.0
        stop_cost = self.verify_cost(width(k))
        gain = 0.0
        for m in range(k + 1, max(limit, k + 1) + 1):
            chain *= sure
            gain += chain
            extra = self.verify_cost(width(m)) - stop_cost + (m - k - 1) * self.draft_token
            if gain > extra / one:
                return True
        return False

    def next_gamma(self, source: str = "") -> int:
        if not self.calibrated:
            raise SettingsError("the adaptive controller has no calibration; "
                                "run it through Pair.generate or pass draft_ms/verify_ms")
        self.probing = False
        # A round that copies from the context is priced by its verify alone.
        self.copying = bool(source) and source == self.copy_source
        if self.rounds < self.opening_plain:
            # Look before leaping: the opening of an answer is where a draft goes wrong most
            # (greedy agreement over the 48 suite prompts: 0.50 at the first token, 0.73 at the
            # second, 0.79 at the third and fourth, 0.83 after; scripts/policy_sim.py), and one
            # lost round is a large share of a short answer. Plain opening rounds show for free
            # how sure the target is; the draft falls only a few tokens behind.
            self.last_prediction = self.predicted_tps(0)
            self.last_reason = (f"plain: opening round {self.rounds + 1} of "
                                f"{self.opening_plain} (the target shows how predictable the "
                                "answer is before the draft is tried)")
            return 0
        speeds = self._speeds()
        g = self.best_gamma(speeds)
        # Probe while nothing is known (no confidence came either): the draft is at most a
        # token behind, so this probe pays no catch-up; later probes do, hence the long,
        # growing intervals. The target's confidence usually brings speculation back first.
        if g == 0 and (self._counts()[0].sum() == 0 or self.zero_run >= self.interval) \
                and self.could_win():
            g = min(self.probe_gamma, self.max_gamma)
            self.probing = True
        self.last_prediction = float(speeds[g])
        self.last_reason = self._reason(g, speeds)
        return g

    def _reason(self, g: int, speeds: np.ndarray) -> str:
        """One line on the choice of `g`, from the predictions that made it."""
        best = int(np.argmax(speeds[1:])) + 1
        cost = self.draft_token / self.verify[0]
        if self.copying:
            what = "copying from the context, which costs no draft decode"
            if g == 0:
                return (f"plain: best predicted {speeds[best] / speeds[0]:.2f}x at gamma "
                        f"{best}, {what}")
            return (f"gamma {g}: predicted {speeds[g] / speeds[0]:.2f}x (first-token "
                    f"acceptance {self.acceptance()[0]:.2f}, {what})")
        if self.probing:
            return (f"probe: gamma {g} to measure the draft again (predicted "
                    f"{speeds[g] / speeds[0]:.2f}x)")
        if g == 0:
            return (f"plain: the draft costs {cost:.2f} of a target token; best predicted "
                    f"{speeds[best] / speeds[0]:.2f}x at gamma {best}")
        return (f"gamma {g}: predicted {speeds[g] / speeds[0]:.2f}x (first-token acceptance "
                f"{self.acceptance()[0]:.2f}, the draft {cost:.2f} of a target token)")

    def update(self, r: RoundStats) -> None:
        self.rounds += 1
        self.elapsed += r.committed
        copied = self.copy_source is not None and r.source == self.copy_source
        if r.drafted > 0 and copied:
            self._learn_acceptance(r.drafted, r.accepted, self.copy_tries, self.copy_hits)
        elif r.drafted > 0:
            self._learn_draft_cost(r.draft_ms, r.drafted)
            self._learn_acceptance(r.drafted, r.accepted, self.tries, self.hits)
            self._learn_scale(r)
        elif r.confidence:
            self._observe_confidence(r.confidence[-1])
        if r.index > 0:
            # The first decode after a prefill is slow (93-114 ms against ~80 here): not a cost
            # any later round pays.
            self._learn_verify_cost(r.width or r.drafted + 1, r.verify_ms)
        if self.model_source is not None and r.source == self.model_source and r.gamma > 0:
            # The model caught up on the text and decoded all it drafted but (usually) the
            # last token: when every drafted token was taken, that one and the bonus are still
            # to feed; otherwise only the target's token.
            self.lag = 2 if r.drafted and r.accepted == r.drafted else 1
        else:
            self.lag += r.committed
        self.speculating = r.gamma > 0
        if r.gamma == 0:
            self.zero_run += 1
        else:
            self.zero_run = 0
            if self.probing:
                won = self.best_gamma() > 0
                self.interval = self.probe_every if won else min(self.interval * 2, self.probe_max)

    def _learn_acceptance(self, drafted: int, accepted: int, tries: np.ndarray,
                          hits: np.ndarray) -> None:
        tries *= self.decay
        hits *= self.decay
        # Positions after the first rejection were not tested: a_j is conditional on j-1 passing.
        seen = min(accepted + 1, drafted, self.max_gamma)
        tries[:seen] += 1.0
        hits[:min(accepted, seen)] += 1.0

    def _learn_scale(self, r: RoundStats) -> None:
        seen = min(r.accepted + 1, r.drafted)
        if len(r.confidence) < seen:
            return
        self.scale_hits = self.decay * self.scale_hits + min(r.accepted, seen)
        self.scale_conf = self.decay * self.scale_conf + float(sum(r.confidence[:seen]))

    def _observe_confidence(self, confidence: float) -> None:
        """A plain round: no draft was tested, but the target's confidence predicts how one
        would have fared; it counts as a fraction of an observation at every position."""
        a = min(self.scale * confidence, 1.0)
        self.tries *= self.decay
        self.hits *= self.decay
        self.tries += self.conf_weight
        self.hits += self.conf_weight * a

    def _learn_draft_cost(self, draft_ms: float, proposed: int) -> None:
        per_token = max(draft_ms - self.catch_up_ms(self.lag), 0.0) / proposed
        self.draft_token += self.rate * (per_token - self.draft_token)

    def _learn_verify_cost(self, width: int, measured: float) -> None:
        while len(self.verify) < width:
            self.verify.append(_at(self.verify, len(self.verify) + 1))
        ratio = measured / self.verify[width - 1]
        if width == 1:
            # A plain round measures the machine's pace: load (another program, heat) slows
            # every decode alike, the draft's too, so all costs take the same step and their
            # ratios, which choose gamma, stay as calibrated. Moving width 1 alone (the old
            # rule) made a spell of plain rounds 8% slower than calibrated tilt the choice
            # towards drafting, and speculation resumed where it lost.
            common = 1.0 + self.rate * (ratio - 1.0)
            self.verify = [v * common for v in self.verify]
            self.draft_token *= common
            self.draft_batch = [d * common for d in self.draft_batch]
            return
        # A wide verify also learns the curve's shape: the width seen moves fully, the others
        # follow a fraction.
        for i in range(len(self.verify)):
            step = self.rate if i == width - 1 else self.rate / 4
            self.verify[i] *= 1.0 + step * (ratio - 1.0)
