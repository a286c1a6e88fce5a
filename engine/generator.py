"""The decoding loop: rounds (engine/round.py: draft, verify in one target pass, roll back)
whose tokens the answer commits (engine/answer.py) until it ends; with no drafter, plain
decoding of the same target through the same code.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from engine.acceptance import verify
from engine.answer import Answer
from engine.clock import Clock, wall_ms
from engine.drafters.base import PLAIN, Drafter
from engine.drafters.history_index import HistoryIndex
from engine.drafters.prediction import with_prediction
from engine.errors import SettingsError
from engine.events import Event, RoundEvent
from engine.generation_config import GenerationConfig
from engine.grammar.guide import Guide
from engine.limits import check_prompt_fits
from engine.control.batch import Mates
from engine.control.policy import FixedGamma, GammaPolicy
from engine.round import NoDrafter, Rounds, VerifyRule, run_round
from engine.rng import Rng
from engine.session import Session
from engine.stats import GenerationStats
from engine.sampling import SamplingParams


def batch_priced(params: SamplingParams) -> bool:
    """Whether a generation's rounds may be priced beside its batch-mates (gamma shrinking as
    the batch fills). Gamma moves a sampled answer's draws (which uniform judges which position),
    so a sampled answer with a seed, which must come out the same alone or in any batch, is
    priced alone; at greedy no draw is made, and without a seed there is no answer to reproduce:
    the batch may shape gamma, and each token's law is the target's either way.

    >>> batch_priced(SamplingParams(temperature=0.7, seed=7)), batch_priced(SamplingParams())
    (False, True)
    """
    return params.greedy or params.seed is None


def generate(target: Session, drafter: Drafter | None, prompt: Sequence[int],
             config: GenerationConfig, policy: GammaPolicy | None = None,
             rule: VerifyRule = verify,
             widths: Callable[[int], int] | None = None, rng: Rng | None = None,
             clock: Clock = wall_ms, history: HistoryIndex | None = None,
             mates: Mates | None = None,
             prediction: Sequence[int] = ()) -> Iterator[Event]:
    """Yield TokenEvents as tokens are committed, a RoundEvent per target call, then DoneEvent.

    `rule` is the verification rule; only the exactness report's negative control swaps it.
    `widths` maps a verify batch's size to the width to decode it at (engine/widths.py).
    `rng` (default: seeded from the sampling params) makes every random choice; `clock` (ms)
    times the phases. Tests inject both: an enumerating rng, a clock driven by a cost profile.
    `history` (past prompts and answers, engine/drafters/history_index.py): a drafter that
    uses one drafts from it as it stands now, and the prompt with its answer is added to it when
    the generation ends, whatever drafted (plain decoding included). `mates`: the sequences it
    is decoded in one batch with (engine/batch_step.py), told what each round puts into its
    step; the policy prices its rounds beside theirs where `batch_priced` allows.
    `prediction`: the answer's expected tokens (a client's predicted output), which a speculating
    generation drafts from before its drafter (engine/drafters/prediction.py); plain decoding
    has nothing to draft with it and decodes as without one."""
    if not prompt:
        raise SettingsError("the prompt is empty")
    if history is not None and drafter is not None and drafter.uses_history:
        drafter = drafter.with_history(history)
    plain = drafter is None or config.gamma == 0
    if drafter is not None and not plain:
        drafter = with_prediction(drafter, prediction, prompt)
    guide = (None if config.grammar is None
             else Guide(config.grammar.start(), target.backend.is_eog))
    rounds = Rounds(target, NoDrafter() if drafter is None or plain else drafter,
                    FixedGamma(0) if plain else policy or FixedGamma(config.gamma),
                    config.params, rng if rng is not None else Rng(config.params.seed),
                    rule, widths, clock, guide, config.logprobs, jump=not plain,
                    mates=mates, beside_mates=batch_priced(config.params))
    stats = GenerationStats(mode=PLAIN if plain else "speculative",
                            drafter=rounds.drafter.name, gamma=0 if plain else config.gamma,
                            prompt_tokens=len(prompt))
    answer = Answer(target.backend, config, stats, clock)
    context = [int(t) for t in prompt]
    check_prompt_fits(len(context), target.backend.n_ctx)
    # What the cache keeps of the prompt (the last token is fed by the first round).
    stats.prompt_cached_tokens = min(target.common_prefix(context), len(context) - 1)
    stats.prompt_computed_tokens = len(context) - stats.prompt_cached_tokens
    target.sync(context, feed_last=False)
    rounds.drafter.prefill(context)
    answer.prefilled()
    decision = None
    while not answer.finish:
        room = answer.room(len(context))
        if room < 0:
            answer.end_at_length()
            break
        result = run_round(rounds, context, room, stats.rounds)
        yield from answer.commit(result, context)
        stats.record_round(result.stats, max(result.stats.drafted, len(stats.drafted_at)))
        if result.stats.width:
            # A round the grammar forced whole ran no model: nothing for the policy to learn.
            rounds.policy.update(result.decision, result.stats)
        stats.output_tokens = len(answer.tokens)
        yield RoundEvent(round=result.stats, stats=stats)
        decision = result.decision
    yield from answer.flush()
    # Leave the target's cache holding every committed token but the last, as between rounds.
    target.rollback(len(context) - 1)
    if history is not None:
        history.add(context)
    if not plain:
        rounds.policy.finish()
    if decision is not None and not plain:
        stats.controller = rounds.policy.report(decision)
    yield answer.done()
