"""One speculative round: the drafter plans (engine/round_plan.py), the policy decides from the
plan, the drafter drafts from the same plan, the target verifies every drafted token in one
batch, and the caches roll back to what the round commits.

Invariant at the start of every round: the target's cache holds every committed token but the
last one. A round decodes [last committed] + drafted tokens in one batch; row i of its logits
is the target's distribution for drafted position i, and row γ gives the bonus distribution.
After verification the target is rolled back to the committed tokens, minus the newest.

A round with nothing drafted (gamma 0, or a plan with nothing to draft) is a plain one-token
decode of the same target through the same code, which is what plain decoding is.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

from engine.acceptance import Verdict, verify
from engine.clock import Clock, wall_ms
from engine.drafters.base import PLAIN, Drafter, Proposal, empty_proposal
from engine.round_plan import NO_PLAN, RoundPlan
from engine.control.policy import Decision, GammaPolicy
from engine.confidence import top_probability
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.transform import Rows
from engine.session import Session
from engine.stats import RoundStats

# verify(p_rows, q_rows, draft_tokens, rng, greedy) -> Verdict
VerifyRule = Callable[..., Verdict]


class NoDrafter(Drafter):
    """The drafter of plain decoding: every round drafts nothing."""

    name = PLAIN

    def plan(self, context, params) -> RoundPlan:
        return NO_PLAN

    def propose(self, plan, gamma, params, rng, keep=None) -> Proposal:
        return empty_proposal(self.name)


@dataclass(frozen=True)
class Rounds:
    """What every round of one generation shares: the models, the policy, the sampling and
    its randomness, the verification rule, the batch widths to pad to, the clock."""

    target: Session
    drafter: Drafter
    policy: GammaPolicy
    params: SamplingParams
    rng: Rng
    rule: VerifyRule = verify
    # Maps a verify batch's size to the width to decode it at (engine/widths.py).
    widths: Callable[[int], int] | None = None
    clock: Clock = wall_ms


@dataclass(frozen=True)
class RoundResult:
    """A round as it happened: the policy's decision, the round's statistics (`committed` is
    filled in as its tokens are committed), and the tokens it offers to commit, in order,
    each with its origin (engine/events.py)."""

    decision: Decision
    stats: RoundStats
    tokens: tuple[int, ...]
    origins: tuple[str, ...]


def verify_width(drafted: int, gamma: int, sampled: bool,
                 widths: Callable[[int], int] | None) -> int:
    """The target batch's width for a round. A batch's rows change with its width in llama.cpp
    (up to 0.7 in a logit, docs/EXACTNESS.md), and how many tokens a sampled draft holds depends
    on the tokens drawn (its stops read them), so for a sampled draft the width is fixed before
    drafting, from gamma: the row that judges x_i then does not move with x_i through the width.
    A draft that does not sample (a copy, a greedy draft) is a function of the committed text,
    so its own length may set the width. Whether to draft at all is decided before the first
    draw, so a round that drafts nothing is a plain one-token decode.

    >>> verify_width(2, 4, sampled=True, widths=None), verify_width(2, 4, False, None)
    (5, 3)
    """
    if not drafted:
        return 1
    want = gamma + 1 if sampled else drafted + 1
    return widths(want) if widths is not None else want


def draft(r: Rounds, plan: RoundPlan, gamma: int) -> Proposal:
    """At most `gamma` tokens drafted as `plan` says, stopped early by the policy's rule (told
    whether the round's verify width is already fixed: a sampled draft's)."""
    if gamma <= 0 or not plan.drafts:
        return empty_proposal(PLAIN)
    keep = partial(r.policy.keep_drafting, limit=gamma, fixed_width=plan.samples)
    return r.drafter.propose(plan, gamma, r.params, r.rng, keep)


def run_round(r: Rounds, context: Sequence[int], room: int, index: int) -> RoundResult:
    """Round `index` after the committed text `context`, drafting at most `room` tokens."""
    plan = r.drafter.plan(context, r.params)
    decision = r.policy.next_gamma(plan)
    gamma = min(decision.gamma, room) if plan.drafts else 0
    # The one predicate for a sampled draft: it fixes the verify width before drafting.
    sampled = gamma > 0 and plan.samples
    t0 = r.clock()
    proposal = draft(r, plan, gamma)
    drafted = [int(t) for t in proposal.tokens]
    draft_ms = r.clock() - t0

    t0 = r.clock()
    width = verify_width(len(drafted), gamma, sampled, r.widths)
    logits = r.target.extend([context[-1]] + drafted, rows=range(len(drafted) + 1),
                             pad_to=width)
    verdict = r.rule(Rows(logits, r.params), proposal.q, proposal.tokens, r.rng,
                     r.params.greedy)
    verify_ms = r.clock() - t0
    # Rows past the first rejection were not tested and are never read: skip their softmax.
    confidence = (tuple(top_probability(logits[:verdict.n_accepted + 1]).tolist())
                  if r.policy.wants_confidence and decision.confidence else ())
    r.target.rollback(len(context) + verdict.n_accepted)
    if drafted:
        r.drafter.feedback(plan, proposal, verdict.n_accepted)

    n = verdict.n_accepted
    stats = RoundStats(index=index, gamma=gamma, drafted=len(drafted), accepted=n,
                       kind=verdict.kind, committed=0, draft_ms=draft_ms, verify_ms=verify_ms,
                       source=proposal.source, is_copy=plan.is_copy,
                       predicted_tps=decision.prediction, reason=decision.reason,
                       confidence=confidence, width=width)
    return RoundResult(decision, stats, tokens=(*drafted[:n], verdict.token),
                       origins=("draft",) * n + (verdict.kind if drafted else PLAIN,))
