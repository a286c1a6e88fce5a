"""The decoding loop: speculative rounds (draft, verify in one target pass, commit, roll back)
and, with no drafter, plain decoding of the same target through the same code.

Invariant at the start of every round: the target's cache holds every committed token but the
last one. A round decodes [last committed] + drafted tokens in one batch; row i of its logits
is the target's distribution for drafted position i, and row γ gives the bonus distribution.
After verification the target is rolled back to the committed tokens, minus the newest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator, Sequence

from engine.acceptance import Verdict, verify
from engine.clock import Clock, wall_ms
from engine.drafters.base import Drafter, Proposal, empty_proposal
from engine.errors import SettingsError
from engine.events import DoneEvent, Event, RoundEvent, TokenEvent
from engine.limits import check_prompt_fits
from engine.policy import FixedGamma, GammaPolicy
from engine.sampling import Rng, Rows, SamplingParams, top_probability
from engine.session import Session
from engine.stats import GenerationStats, RoundStats
from engine.textstream import TextStream

MAX_GAMMA = 32

# verify(p_rows, q_rows, draft_tokens, rng, greedy) -> Verdict
VerifyRule = Callable[..., Verdict]


@dataclass(frozen=True)
class GenerationConfig:
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = 4
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (0 <= self.gamma <= MAX_GAMMA):
            raise SettingsError(f"gamma must be between 0 and {MAX_GAMMA}, got {self.gamma}")
        if self.max_tokens < 1:
            raise SettingsError(f"max tokens must be >= 1, got {self.max_tokens}")


def _keep(policy: GammaPolicy, limit: int, fixed_width: bool, own: Sequence[float],
          sure: float) -> bool:
    return policy.keep_drafting(own, sure, limit, fixed_width)


def _verify_width(proposal: Proposal, gamma: int, widths: Callable[[int], int] | None) -> int:
    """The target batch's width for a round. A batch's rows change with its width in llama.cpp
    (up to 0.7 in a logit, docs/EXACTNESS.md), and how many tokens a sampled draft holds depends
    on the tokens drawn (its stops read them), so for a sampled draft the width is fixed before
    drafting, from gamma: the row that judges x_i then does not move with x_i through the width.
    A proposal without q rows (a copy, a greedy draft) is a function of the committed text, so
    its own length may set the width. Whether to draft at all is decided before the first draw,
    so a round that drafts nothing is a plain one-token decode."""
    if not len(proposal):
        return 1
    want = gamma + 1 if proposal.q is not None else len(proposal) + 1
    return widths(want) if widths is not None else want


def generate(target: Session, drafter: Drafter | None, prompt: Sequence[int],
             config: GenerationConfig, policy: GammaPolicy | None = None,
             rule: VerifyRule = verify,
             widths: Callable[[int], int] | None = None, rng: Rng | None = None,
             clock: Clock = wall_ms) -> Iterator[Event]:
    """Yield TokenEvents as tokens are committed, a RoundEvent per target call, then DoneEvent.

    `rule` is the verification rule; only the exactness report's negative control swaps it.
    `widths` maps a verify batch's size to the width to decode it at (engine/widths.py).
    `rng` (default: seeded from the sampling params) makes every random choice; `clock` (ms)
    times the phases. Tests inject both: an enumerating rng, a clock driven by a cost profile."""
    if not prompt:
        raise SettingsError("the prompt is empty")
    params = config.params
    rng = rng if rng is not None else Rng(params.seed)
    speculative = drafter is not None and config.gamma > 0
    policy = policy or FixedGamma(config.gamma if speculative else 0)
    wants_confidence = speculative and policy.wants_confidence
    backend = target.backend
    stats = GenerationStats(mode="speculative" if speculative else "baseline",
                            drafter=drafter.name if speculative else "none",
                            gamma=config.gamma if speculative else 0, prompt_tokens=len(prompt))
    stream = TextStream(backend.token_bytes, config.stop)
    seq = [int(t) for t in prompt]
    out: list[int] = []

    t_start = clock()
    check_prompt_fits(len(seq), backend.n_ctx)
    target.sync(seq, feed_last=False)
    if speculative:
        drafter.prefill(seq)
    t_prefill = clock()
    stats.prefill_ms = t_prefill - t_start

    finish = ""
    while not finish:
        room = min(config.max_tokens - len(out) - 1, backend.n_ctx - len(seq) - 1)
        if room < 0:
            finish = "length"
            break
        chosen = (policy.next_gamma(drafter.copies(seq), drafter.behind(seq))
                  if speculative else 0)
        gamma = min(chosen, room)
        t0 = clock()
        proposal: Proposal = (drafter.propose(seq, gamma, params, rng,
                                              partial(_keep, policy, gamma, not params.greedy))
                              if gamma > 0 else empty_proposal("none"))
        drafted = [int(t) for t in proposal.tokens]
        draft_ms = clock() - t0

        t0 = clock()
        width = _verify_width(proposal, gamma, widths)
        logits = target.extend([seq[-1]] + drafted, rows=range(len(drafted) + 1), pad_to=width)
        p = Rows(logits, params)
        verdict = rule(p, proposal.q, proposal.tokens, rng, params.greedy)
        verify_ms = clock() - t0
        # Rows past the first rejection were not tested and are never read: skip their softmax.
        confidence = (tuple(top_probability(logits[:verdict.n_accepted + 1]).tolist())
                      if wants_confidence else ())
        target.rollback(len(seq) + verdict.n_accepted)
        if speculative:
            drafter.feedback(proposal, verdict.n_accepted)

        new = drafted[:verdict.n_accepted] + [verdict.token]
        origins = ["draft"] * verdict.n_accepted + [verdict.kind if drafted else "target"]
        r = RoundStats(index=stats.rounds, gamma=gamma, drafted=len(drafted),
                       accepted=verdict.n_accepted, kind=verdict.kind, committed=0,
                       draft_ms=draft_ms, verify_ms=verify_ms, source=proposal.source,
                       copied=proposal.copied,
                       predicted_tps=policy.last_prediction, reason=policy.last_reason,
                       confidence=confidence,
                       width=width)
        for tok, origin in zip(new, origins):
            if backend.is_eog(tok):
                finish = "eos"
                break
            seq.append(tok)
            out.append(tok)
            stats.origins.append(origin)
            r.committed += 1
            text = stream.push(tok)
            if not stats.ttft_ms:
                stats.ttft_ms = clock() - t_start
            yield TokenEvent(token=tok, text=text, origin=origin, index=len(out) - 1)
            if stream.stopped:
                finish = "stop"
                break
            if len(out) >= config.max_tokens:
                finish = "length"
                break
        stats.record_round(r, max(len(drafted), len(stats.drafted_at)))
        policy.update(r)
        stats.output_tokens = len(out)
        yield RoundEvent(round=r, stats=stats)

    tail = stream.finish()
    if tail:
        yield TokenEvent(token=-1, text=tail, origin="flush", index=len(out) - 1)
    # Leave the target's cache holding every committed token but the last, as between rounds.
    target.rollback(len(seq) - 1)
    t_end = clock()
    stats.output_tokens = len(out)
    stats.total_time_ms = t_end - t_start
    stats.decode_time_ms = t_end - t_prefill
    stats.finish_reason = finish
    if speculative and stats.rounds:
        stats.controller = policy.report(chosen)
    if not stats.ttft_ms:
        stats.ttft_ms = stats.total_time_ms
    yield DoneEvent(text=stream.text, stats=stats, tokens=tuple(out))
