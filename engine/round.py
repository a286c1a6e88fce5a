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

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

from engine.acceptance import Verdict, verify
from engine.errors import DraftLawError
from engine.clock import Clock, wall_ms
from engine.drafters.base import PLAIN, Drafter, Proposal, empty_proposal
from engine.events import FORCED
from engine.grammar.guide import Guide
from engine.grammar.mask import MaskedRows
from engine.logprobs import TokenLogprob, token_logprob
from engine.round_plan import NO_PLAN, RoundPlan
from engine.control.batch import ALONE, Mates, Share
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

    def propose(self, plan, gamma, params, rng, keep=None, guide=None) -> Proposal:
        return empty_proposal(self.name)


@dataclass(frozen=True)
class Rounds:
    """What every round of one generation shares: the models, the policy, the sampling and
    its randomness, the verification rule, the batch widths to pad to, the clock; under a
    grammar, its walk (engine/grammar/guide.py); and how many alternatives each committed
    token's log probability comes with (None: no log probabilities)."""

    target: Session
    drafter: Drafter
    policy: GammaPolicy
    params: SamplingParams
    rng: Rng
    rule: VerifyRule = verify
    # Maps a verify batch's size to the width to decode it at (engine/widths.py).
    widths: Callable[[int], int] | None = None
    clock: Clock = wall_ms
    guide: Guide | None = None
    logprobs: int | None = None
    # Whether forced tokens are committed without a model (speculation does); plain decoding
    # decodes every token, forced or not, one target call each, as a plain decoder does.
    jump: bool = True
    # The sequences decoded in the same steps (`--parallel`, engine/batch_step.py): each round
    # reports to them what it put into its step, and, when `beside_mates`, the policy prices it
    # beside theirs; else alone, as a generation whose draws the batch must not move
    # (`batch_priced`, engine/generator.py).
    mates: Mates | None = None
    beside_mates: bool = True


@dataclass(frozen=True)
class RoundResult:
    """A round as it happened: the policy's decision, the round's statistics (`committed` is
    filled in as its tokens are committed), and the tokens it offers to commit, in order,
    each with its origin (engine/events.py) and, when asked, its log probability."""

    decision: Decision
    stats: RoundStats
    tokens: tuple[int, ...]
    origins: tuple[str, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


def verify_width(drafted: int, gamma: int, sampled: bool,
                 widths: Callable[[int], int] | None, fed: int = 1) -> int:
    """The target batch's width for a round that feeds `fed` committed tokens (the last one,
    and any forced ones) before its draft. A batch's rows change with its width in llama.cpp
    (up to 0.7 in a logit, docs/EXACTNESS.md), and how many tokens a sampled draft holds depends
    on the tokens drawn (its stops read them), so for a sampled draft the width is fixed before
    drafting, from gamma: the row that judges x_i then does not move with x_i through the width.
    A draft that does not sample (a copy, a greedy draft) is a function of the committed text,
    so its own length may set the width. Whether to draft at all is decided before the first
    draw, so a round that drafts nothing is a plain decode of what it feeds.

    >>> verify_width(2, 4, sampled=True, widths=None), verify_width(2, 4, False, None)
    (5, 3)
    """
    if not drafted:
        return fed
    want = fed + gamma if sampled else fed + drafted
    return widths(want) if widths is not None else want


def draft(r: Rounds, plan: RoundPlan, gamma: int) -> Proposal:
    """At most `gamma` tokens drafted as `plan` says, stopped early by the policy's rule (told
    whether the round's verify width is already fixed: a sampled draft's); under a grammar, a
    model masks its q rows by the round's walk, and the round cuts a copy before the first token
    the grammar forbids."""
    if gamma <= 0 or not plan.drafts:
        return empty_proposal(PLAIN)
    keep = partial(r.policy.keep_drafting, limit=gamma, fixed_width=plan.samples)
    if r.guide is None:
        return r.drafter.propose(plan, gamma, r.params, r.rng, keep)
    if r.drafter.guided:
        proposal = r.drafter.propose(plan, gamma, r.params, r.rng, keep, guide=r.guide)
    else:
        proposal = r.drafter.propose(plan, gamma, r.params, r.rng, keep)
        if proposal.q is not None:
            # Cutting a sampled draft at a forbidden token would read the token itself, and its
            # q rows are not the constrained q: not exact (tests/test_exactness_grammar.py).
            raise DraftLawError(f"{proposal.source or r.drafter.name} samples its draft but does "
                                "not mask it by the grammar (Drafter.guided)")
    n = r.guide.walk(proposal.tokens.tolist())
    if n < len(proposal):
        proposal = replace(proposal, tokens=proposal.tokens[:n],
                           q=None if proposal.q is None or not n else proposal.q[:n])
    return proposal


def run_round(r: Rounds, context: Sequence[int], room: int, index: int) -> RoundResult:
    """Round `index` after the committed text `context`, offering at most `room` + 1 tokens."""
    forced: list[int] = []
    if r.guide is not None and r.jump:
        forced, complete = r.guide.forced(room)
        if complete and r.logprobs is None:
            # The grammar allows only the end: the answer ends here, and no model runs.
            return _forced_round(r, forced, r.guide.mask().single, index)
        if forced:
            context = [*context, *forced]
            room -= len(forced)
    plan = r.drafter.plan(context, r.params)
    decision = r.policy.next_gamma(
        plan, r.mates.batch() if r.mates is not None and r.beside_mates and plan.drafts
        else ALONE)
    gamma = min(decision.gamma, room) if plan.drafts else 0
    # The one predicate for a sampled draft: it fixes the verify width before drafting.
    sampled = gamma > 0 and plan.samples
    if sampled and plan.model_drafts and r.mates is not None:
        # Its catch-up and a decode after each drawn token but the last: gamma steps of the
        # batch, however soon the draws stop it (engine/batch_step.py).
        r.mates.draft_parts(gamma)
    t0 = r.clock()
    proposal = draft(r, plan, gamma)
    drafted = [int(t) for t in proposal.tokens]
    draft_ms = r.clock() - t0

    t0 = r.clock()
    # What the target has not decoded of the text (the last committed token, and the forced
    # ones), then the draft; rows from the last of the text on, and the forced tokens' own
    # when log probabilities are asked for.
    fed = list(context[r.target.n_past:])
    first = len(fed) - 1 - (len(forced) if r.logprobs is not None else 0)
    width = verify_width(len(drafted), gamma, sampled, r.widths, fed=len(fed))
    logits = r.target.extend(fed + drafted, rows=range(first, len(fed) + len(drafted)),
                             pad_to=width)
    own = logits[len(fed) - 1 - first:]
    rows = (Rows(own, r.params) if r.guide is None
            else MaskedRows(own, r.params, r.guide.mask_at))
    verdict = r.rule(rows, proposal.q, proposal.tokens, r.rng, r.params.greedy)
    verify_ms = r.clock() - t0
    n = verdict.n_accepted
    # Rows past the first rejection were not tested and are never read: skip their softmax.
    confidence = (tuple(top_probability(own[:n + 1]).tolist())
                  if r.policy.wants_confidence and decision.confidence else ())
    r.target.rollback(len(context) + n)
    if r.guide is not None:
        r.guide.settle(n, verdict.token)
    if drafted:
        r.drafter.feedback(plan, proposal, n)

    stats = RoundStats(index=index, gamma=gamma, drafted=len(drafted), accepted=n,
                       kind=verdict.kind, committed=0, draft_ms=draft_ms, verify_ms=verify_ms,
                       source=proposal.source, is_copy=plan.is_copy,
                       predicted_tps=decision.prediction, reason=decision.reason,
                       confidence=confidence, width=width, forced=len(forced),
                       token=verdict.token)
    tokens = (*forced, *drafted[:n], verdict.token)
    if r.mates is not None:
        r.mates.report(Share(width, float(len(tokens)), len(drafted) if plan.model_drafts else 0))
    return RoundResult(decision, stats, tokens=tokens,
                       origins=(FORCED,) * len(forced) + ("draft",) * n
                       + (verdict.kind if drafted else PLAIN,),
                       logprobs=_logprobs(logits, tokens, r.logprobs))


def _forced_round(r: Rounds, forced: list[int], end: int | None, index: int) -> RoundResult:
    """A round of forced tokens and the end of the answer, which the constrained target gives
    with probability 1: committed without a model."""
    assert end is not None
    if r.guide is not None:
        r.guide.settle(0, end)
    decision = Decision(0, reason="the grammar forces the rest of the answer")
    stats = RoundStats(index=index, gamma=0, drafted=0, accepted=0, kind=FORCED, committed=0,
                       draft_ms=0.0, verify_ms=0.0, source=FORCED, forced=len(forced))
    return RoundResult(decision, stats, tokens=(*forced, end),
                       origins=(FORCED,) * (len(forced) + 1))


def _logprobs(logits, tokens: Sequence[int], top: int | None) -> tuple[TokenLogprob, ...]:
    """Each committed token's log probability under the target's row for its position (rows
    and tokens align: the forced tokens' rows, then the draft's up to the verdict's)."""
    if top is None:
        return ()
    return tuple(token_logprob(logits[i], t, top) for i, t in enumerate(tokens))
