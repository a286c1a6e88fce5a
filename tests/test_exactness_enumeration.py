"""Exact enumeration: the law of the first three emitted tokens, computed over every random
choice the engine makes (tests/exact_law.py), equals the target's law to 1e-9 for every drafter,
policy and sampling setting; the old inexact shortcuts (the trim that read a drafted token's own
probability, p-min checked on the drawn token) are caught by the same enumeration.

Tiny fakes (8 tokens, logits a table on the last two tokens, token 7 ends the answer), drafts
with gamma up to 2 (three tokens leave room for no more), a virtual clock so the adaptive
controller's decisions repeat exactly. The prompt holds every token and repeats a bigram, so
prompt lookup always has a match and hybrid starts with one.
"""
from __future__ import annotations


import numpy as np
import pytest

from engine.acceptance import Verdict, speculative_verify, verify
from engine.control.controller import AdaptiveController
from engine.dist import Dist
from engine.drafters.base import Drafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.early_exit import early_exit_drafter
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.prediction import PredictionDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent, RoundEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.control.policy import FixedGamma, GammaPolicy, HeuristicGamma, NeverDraft
from engine import transform as engine_transform
from engine.rng import Rng
from engine.round_plan import PREDICTION
from engine.sampling import SamplingParams
from engine.transform import distribution, probabilities
from engine.session import Session
from bench.fakes.table import TableFake, VirtualClock
from tests.exact_law import exact_law, target_law, total_variation
from tests.old_shortcuts import OldPMin, OldTrim

V, EOG, N = 8, 7, 3
PROMPT = [0, 1, 2, 3, 4, 5, 6, 1, 2]
# A cost profile under which the adaptive controller drafts, and its stopping rule still cuts
# rows the draft is unsure of (a second verify row costs 0.4 of a target token); and a
# GPU-like one (flat verify, cheap draft), under which it resumes drafting after its opening.
VERIFY = [10.0, 14.0, 16.0, 18.0]
DRAFT = [1.0, 1.2, 1.4, 1.6]
FLAT_VERIFY = [10.0, 10.2, 10.4, 10.6]
CHEAP_DRAFT = [1.0, 1.1, 1.2, 1.3]

SAMPLINGS = {
    "T=1": (SamplingParams(temperature=1.0), 0.0),
    "T=0.7 top-p 0.9": (SamplingParams(temperature=0.7, top_p=0.9), 0.0),
    # Logits on a 0.5 grid, so the k-th largest is often tied and top-k keeps the tie.
    "top-k 3 with ties": (SamplingParams(temperature=1.0, top_k=3), 0.5),
    "min-p 0.1": (SamplingParams(temperature=1.0, min_p=0.1), 0.0),
}
DRAFTERS = ("draft-model", "lookup", "hybrid", "trimmed-vocab", "early-exit")
POLICIES = ("fixed", "heuristic", "plain", "adaptive", "adaptive-opening")


def model_drafter(kind: str, clock: VirtualClock, grid: float) -> DraftModelDrafter:
    if kind == "trimmed-vocab":
        backend = TableFake(seed=1, noise=0.8, eog=EOG, grid=grid, clock=clock, cost=DRAFT,
                            keep_ids=[0, 1, 2, 3, 5, EOG])
        return DraftModelDrafter(backend, chain_min=0.5)
    if kind == "early-exit":
        backend = TableFake(seed=1, noise=0.4, eog=EOG, grid=grid, clock=clock, cost=DRAFT)
        return early_exit_drafter(backend, p_min=0.2, chain_min=0.5)
    backend = TableFake(seed=1, noise=0.8, eog=EOG, grid=grid, clock=clock, cost=DRAFT)
    # Every stop on: the chain, p-min, and the end-of-generation token.
    return DraftModelDrafter(backend, p_min=0.2, chain_min=0.5)


def make_drafter(kind: str, clock: VirtualClock, grid: float) -> Drafter:
    if kind == "lookup":
        return PromptLookupDrafter(ngram_max=2, is_eog=lambda t: t == EOG)
    if kind == "hybrid":
        return HybridDrafter(PromptLookupDrafter(ngram_max=2, ngram_min=2,
                                                 is_eog=lambda t: t == EOG),
                             model_drafter("draft-model", clock, grid))
    return model_drafter(kind, clock, grid)


def make_policy(kind: str, drafter: Drafter) -> GammaPolicy:
    if kind == "fixed":
        return FixedGamma(2)
    if kind == "heuristic":
        return HeuristicGamma(1)
    if kind == "plain":
        return NeverDraft()
    # Labelled as the pair calibrates them (the drafter declares its model).
    source = drafter.model_name
    if kind == "adaptive":
        return CountingController(max_gamma=2, draft_ms=DRAFT, verify_ms=VERIFY,
                                  model_name=source, opening=())
    return AdaptiveController(max_gamma=2, draft_ms=CHEAP_DRAFT, verify_ms=FLAT_VERIFY,
                              model_name=source, opening_plain=1)


class CountingController(AdaptiveController):
    """The adaptive controller, counting the draws its stopping rule declined."""
    cuts = 0

    def keep_drafting(self, own, sure, limit, fixed_width) -> bool:
        keep = super().keep_drafting(own, sure, limit, fixed_width)
        CountingController.cuts += not keep
        return keep


def law_of(sampling: str, build_drafter, build_policy, **given) -> tuple[dict, dict, int]:
    """(speculative law, target law, leaves that drafted) of the first N tokens; `given`: more
    of `generate`'s arguments (a prediction, a verification rule)."""
    params, grid = SAMPLINGS[sampling]
    drafted_leaves = [0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(TableFake(seed=1, eog=EOG, grid=grid, clock=clock, cost=VERIFY))
        drafter = build_drafter(clock, grid)
        policy = build_policy(drafter)
        config = GenerationConfig(params=params, gamma=2, max_tokens=N)
        done = [ev for ev in generate(target, drafter, PROMPT, config, policy, rng=rng,
                                      clock=clock.now, **given) if isinstance(ev, DoneEvent)][0]
        drafted_leaves[0] += done.stats.drafted_tokens > 0
        return done.tokens

    spec = exact_law(run)
    want = target_law(TableFake(seed=1, eog=EOG, grid=grid), PROMPT, params, N)
    return spec, want, drafted_leaves[0]


@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_path_emits_the_targets_law_exactly(drafter, policy, sampling):
    CountingController.cuts = 0
    spec, want, drafted = law_of(sampling, lambda c, g: make_drafter(drafter, c, g),
                                 lambda d: make_policy(policy, d))
    assert sum(spec.values()) == pytest.approx(1.0, abs=1e-12)
    assert total_variation(spec, want) < 1e-9
    # The case really speculated, or the adaptive controller's stopping rule declined to
    # (except the control that never drafts).
    if policy == "plain":
        assert drafted == 0
    else:
        assert drafted > 0 or CountingController.cuts > 0


def test_the_adaptive_stopping_rule_both_draws_and_declines_and_stays_exact():
    """Without the chain stop, the round's second token is the stopping rule's call: drawn
    when the first token's q(x) times the next row's largest probability pays for a third
    verify row (0.2 of a target token), declined otherwise, within one enumeration."""
    CountingController.cuts = 0
    spec, want, drafted = law_of(
        "T=1", lambda c, g: DraftModelDrafter(TableFake(seed=1, noise=0.8, eog=EOG, grid=g,
                                                        clock=c, cost=DRAFT)),
        lambda d: CountingController(max_gamma=2, draft_ms=DRAFT, verify_ms=[10.0, 13.0, 15.0, 17.0],
                                     model_name=d.name, opening=()))
    assert drafted > 0 and CountingController.cuts > 0
    assert total_variation(spec, want) < 1e-9


def test_the_top_k_case_really_has_ties_at_the_boundary():
    fake = TableFake(seed=1, eog=EOG, grid=0.5)
    rows = fake.table.reshape(-1, V)
    kth = np.sort(rows, axis=1)[:, -3]
    assert np.sum(rows == kth[:, None], axis=1).max() >= 2
    kept = [np.count_nonzero(probabilities(r, SAMPLINGS["top-k 3 with ties"][0])) for r in rows]
    assert max(kept) > 3


def test_greedy_is_exact_too():
    """Greedy: the law is a point mass on the target's argmax path, whatever is drafted."""
    SAMPLINGS["greedy"] = (SamplingParams(temperature=0.0), 0.0)
    try:
        for drafter in DRAFTERS:
            spec, want, _ = law_of("greedy", lambda c, g: make_drafter(drafter, c, g),
                                   lambda d: make_policy("adaptive", d))
            assert len(want) == 1 and total_variation(spec, want) < 1e-12
    finally:
        del SAMPLINGS["greedy"]


# --- negative controls: the old shortcuts, each read a drafted token's own value -------------

# At T = 1 the draft's rows are wide and the enumeration takes 20-25 s per control; the
# T = 0.7 + top-p 0.9 case catches both in a second, so T = 1 runs with --all.
CONTROL_SAMPLINGS = [pytest.param("T=1", marks=pytest.mark.long), "T=0.7 top-p 0.9"]


@pytest.mark.parametrize("sampling", CONTROL_SAMPLINGS)
def test_the_old_trim_is_caught(sampling):
    spec, want, drafted = law_of(
        sampling, lambda c, g: OldTrim(DraftModelDrafter(
            TableFake(seed=1, noise=0.8, eog=EOG, grid=g, clock=c, cost=DRAFT), chain_min=0.5),
            VERIFY),
        lambda d: FixedGamma(2))
    tv = total_variation(spec, want)
    assert drafted and tv > 1e-3


@pytest.mark.parametrize("sampling", CONTROL_SAMPLINGS)
def test_the_old_p_min_is_caught(sampling):
    spec, want, drafted = law_of(
        sampling, lambda c, g: OldPMin(
            TableFake(seed=1, noise=0.8, eog=EOG, grid=g, clock=c, cost=DRAFT), p_min=0.3),
        lambda d: FixedGamma(2))
    tv = total_variation(spec, want)
    assert drafted and tv > 1e-3


def test_the_enumeration_itself_is_right_on_a_hand_computed_case():
    """q = (0.9, 0.1), p = (0.5, 0.5): the issue's worked example. The exact rule gives a with
    0.5; dropping b whenever it is drawn and sampling from p instead gives 0.55."""
    p = [Dist.dense([0.5, 0.5]), Dist.dense([0.5, 0.5])]
    q = Dist.dense([0.9, 0.1])

    def dropping(rng):
        x = rng.draw(q)
        if x == 1:
            return rng.draw(p[0])
        v = speculative_verify(p, [q], np.array([x]), rng)
        return x if v.n_accepted else v.token

    assert exact_law(dropping)[0] == pytest.approx(0.55, abs=1e-12)
    first = exact_law(lambda rng: _first_token(p, q, rng))
    assert first[0] == pytest.approx(0.5, abs=1e-12)


def _first_token(p, q, rng):
    x = rng.draw(q)
    v = speculative_verify(p, [q], np.array([x]), rng)
    return x if v.n_accepted else v.token


def test_hybrid_priced_apart_really_copies_in_the_enumeration():
    """The adaptive policy prices hybrid's copies by their verify alone (the round's plan is a
    copy): the enumerated runs include rounds drafted by prompt lookup, and the law stays
    exact."""
    params, grid = SAMPLINGS["T=1"]
    copied = [0]

    def run(rng):
        clock = VirtualClock()
        target = Session(TableFake(seed=1, eog=EOG, grid=grid, clock=clock, cost=VERIFY))
        drafter = make_drafter("hybrid", clock, grid)
        policy = make_policy("adaptive", drafter)
        config = GenerationConfig(params=params, gamma=2, max_tokens=N)
        events = list(generate(target, drafter, PROMPT, config, policy, rng=rng,
                               clock=clock.now))
        copied[0] += any(type(e).__name__ == "RoundEvent" and e.round.drafted
                         and e.round.is_copy for e in events)
        return events[-1].tokens

    spec = exact_law(run)
    assert copied[0] > 0
    assert total_variation(spec, target_law(TableFake(seed=1, eog=EOG, grid=grid), PROMPT,
                                            params, N)) < 1e-9


@pytest.mark.parametrize("sampling", ["T=1", "T=0.7 top-p 0.9", "min-p 0.1"])
@pytest.mark.parametrize("drafter", ["draft-model", "lookup", "hybrid"])
def test_lazy_rows_with_a_tail_emit_the_targets_law_exactly(drafter, sampling, monkeypatch):
    """A row without top-k exponentiates only the tokens near its top (engine/dist.py) and
    settles coins and nuclei from bounds on the rest. With TAIL_NATS at 1 most of these 8-token
    rows are tail, so every shortcut runs: each has the exact law it stands for, and the law
    of the output is still the target's."""
    monkeypatch.setattr(engine_transform, "TAIL_NATS", 1.0)
    monkeypatch.setattr(engine_transform, "LAZY_FROM", 0)
    row = TableFake(seed=1, eog=EOG).table[0, 1]
    assert distribution(row, SamplingParams(temperature=1.0)).lazy
    spec, want, drafted = law_of(sampling, lambda c, g: make_drafter(drafter, c, g),
                                 lambda d: make_policy("fixed", d))
    assert drafted > 0
    assert total_variation(spec, want) < 1e-9


# --- a 64-token copy -------------------------------------------------------------------------

# A long copy source: the prompt holds SOURCE and then its first four tokens again, so prompt
# lookup copies the 64 tokens after them; the target follows SOURCE one-hot except at the
# copy's positions 0, 31 and 63, where it splits evenly with another token (off the copy it is
# one-hot on token 0). Three tokens and an end; the verify curve is flat to 65 rows, so the
# adaptive controller (model capped at gamma 2) drafts the whole copy at once.
LONG_V, LONG_EOG, LONG_N = 4, 3, 66
SOURCE = [int(t) for t in np.random.default_rng(5).integers(0, 3, 72)]
LONG_PROMPT = SOURCE + SOURCE[:4]
SPLITS = (0, 31, 63)
FLAT_65 = [10.0] * 65


class CopyTarget(TableFake):
    """The long copy's target (above); a decode of w tokens costs FLAT_65[w - 1]."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        super().__init__(n_vocab=LONG_V, eog=LONG_EOG, clock=clock, cost=FLAT_65)

    def _row(self, context):
        row = np.full(LONG_V, -np.inf, dtype=np.float32)
        out = list(context[len(LONG_PROMPT):])
        i = len(out)
        on_copy = len(context) >= len(LONG_PROMPT) and out == SOURCE[4:4 + i] and i < 64
        if not on_copy:
            row[0] = 0.0
            return row
        row[SOURCE[4 + i]] = 0.0
        if i in SPLITS:
            row[(SOURCE[4 + i] + 1) % 3] = 0.0
        return row


def _deep_trusting_verify(p, q, draft, rng, greedy):
    """A wrong rule, the negative control: a copy's first 40 tokens are judged by the one-hot
    rule, every later one the target allows is accepted without its coin."""
    for i in range(len(draft)):
        x, pi = int(draft[i]), p[i]
        if (i >= 40 and pi.prob(x) > 0) or rng.coin(pi.prob(x)):
            continue
        return Verdict(i, rng.draw_without(pi, x), "correction")
    return Verdict(len(draft), rng.draw(p[len(draft)]), "bonus")


def long_copy_law(rule=None) -> tuple[dict, dict, int]:
    """(speculative law, target law, the longest round drafted) of the first LONG_N tokens."""
    params = SamplingParams(temperature=1.0)
    longest = [0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(CopyTarget(clock))
        drafter = PromptLookupDrafter(ngram_max=3, is_eog=lambda t: t == LONG_EOG)
        policy = AdaptiveController(max_gamma=2, draft_ms=[0.0] * 65, verify_ms=FLAT_65,
                                    opening=())
        config = GenerationConfig(params=params, gamma=2, max_tokens=LONG_N)
        kw = {} if rule is None else {"rule": rule}
        events = list(generate(target, drafter, LONG_PROMPT, config, policy, rng=rng,
                               clock=clock.now, **kw))
        longest[0] = max([longest[0]] + [e.round.drafted for e in events
                                         if type(e).__name__ == "RoundEvent"])
        return events[-1].tokens

    spec = exact_law(run)
    return spec, target_law(CopyTarget(), LONG_PROMPT, params, LONG_N), longest[0]


def test_a_64_token_copy_emits_the_targets_law_exactly():
    """One round drafts the whole 64-token copy (past the model's gamma of 2), its splits at
    positions 0, 31 and 63 each decided by the one-hot rule's coin: the law of 66 tokens is the
    target's."""
    spec, want, longest = long_copy_law()
    assert longest == 64 and len(want) >= 4
    assert total_variation(spec, want) < 1e-9


def test_a_rule_wrong_only_deep_in_a_64_token_copy_is_caught():
    spec, want, longest = long_copy_law(_deep_trusting_verify)
    assert longest == 64 and total_variation(spec, want) > 1e-3


# --- predicted outputs: a copy of the answer the client expects -----------------------------

# The target's greedy path after PROMPT is 4 6 2 3 3 5. A right prediction, one wrong at two
# positions, and one that is wrong at its first token and then holds the path: after the target
# departs from it (4 for its 5), the text's last token occurs in it again and copying resumes
# (a 1-gram match, so that the rejoin fits in three tokens).
PREDICTIONS = {
    "right": ((4, 6, 2, 3, 3, 5), 3),
    "wrong at some positions": ((4, 1, 2, 3, 0, 5), 3),
    "diverges and rejoins": ((5, 4, 6, 2, 3), 1),
}
PREDICTING = ("lookup", "hybrid", "draft-model")


def predicting(kind: str, case: str):
    """A drafter of `kind` with the case's prediction in front of it, as a generation makes it
    (engine/drafters/prediction.py), at the case's n-gram."""
    prediction, ngram = PREDICTIONS[case]
    return lambda c, g: PredictionDrafter(make_drafter(kind, c, g), prediction, PROMPT,
                                          ngram=ngram)


def prediction_rounds(sampling: str, build_drafter, build_policy, rule=verify) -> dict:
    """How often the enumerated runs drafted from the prediction, had a predicted token
    rejected, and drafted from it again after a rejection."""
    params, grid = SAMPLINGS[sampling]
    seen = {"drafted": 0, "rejected": 0, "resumed": 0}

    def run(rng):
        clock = VirtualClock()
        target = Session(TableFake(seed=1, eog=EOG, grid=grid, clock=clock, cost=VERIFY))
        drafter = build_drafter(clock, grid)
        config = GenerationConfig(params=params, gamma=2, max_tokens=N)
        rejected = False
        for ev in generate(target, drafter, PROMPT, config, build_policy(drafter), rng=rng,
                           rule=rule, clock=clock.now):
            if isinstance(ev, RoundEvent) and ev.round.source == PREDICTION:
                seen["drafted"] += 1
                seen["resumed"] += rejected
                rejected = rejected or ev.round.accepted < ev.round.drafted
                seen["rejected"] += ev.round.accepted < ev.round.drafted
        return ev.tokens

    exact_law(run)
    return seen


@pytest.mark.parametrize("sampling", ["T=1", "T=0.7 top-p 0.9", "top-k 3 with ties"])
@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("drafter", PREDICTING)
@pytest.mark.parametrize("case", sorted(PREDICTIONS))
def test_a_prediction_emits_the_targets_law_exactly(case, drafter, policy, sampling):
    """Drafting from a prediction, right, wrong at some positions, or departing and rejoining,
    in front of each kind of drafter: the target's law, to 1e-9."""
    spec, want, drafted = law_of(sampling, predicting(drafter, case),
                                 lambda d: make_policy(policy, d))
    assert drafted > 0
    assert total_variation(spec, want) < 1e-9


@pytest.mark.parametrize("case", sorted(PREDICTIONS))
def test_each_prediction_case_drafts_as_it_says(case):
    """The cases are what they are named: the prediction is drafted in each; the wrong ones
    have predicted tokens rejected; the rejoining one drafts from it again after a rejection."""
    seen = prediction_rounds("T=1", predicting("hybrid", case), lambda d: FixedGamma(2))
    assert seen["drafted"] > 0
    if case != "right":
        assert seen["rejected"] > 0
    if case == "diverges and rejoins":
        assert seen["resumed"] > 0


def test_a_prediction_given_to_the_generation_is_exact():
    """The prediction as `generate` takes it (the default n-gram), at greedy and sampled."""
    prediction = PREDICTIONS["wrong at some positions"][0]
    for sampling in ("T=1", "T=0.7 top-p 0.9"):
        spec, want, drafted = law_of(sampling, lambda c, g: make_drafter("lookup", c, g),
                                     lambda d: FixedGamma(2), prediction=prediction)
        assert drafted > 0 and total_variation(spec, want) < 1e-9


def trusting_verify(p, q, draft, rng, greedy):
    """The negative control: a rejected copied token's correction drawn from p itself, so the
    rejected token may come back (the one-hot rule draws from p without it)."""
    if greedy or q is not None:
        return verify(p, q, draft, rng, greedy)
    for i in range(len(draft)):
        x = int(draft[i])
        if not rng.coin(p[i].prob(x)):
            return Verdict(i, rng.draw(p[i]), "correction")
    return Verdict(len(draft), rng.draw(p[len(draft)]), "bonus")


@pytest.mark.parametrize("case", sorted(PREDICTIONS))
def test_a_prediction_verified_wrongly_is_caught(case):
    """Each prediction case with the trusting rule: the enumeration sees the bias (at T = 1,
    where the wrong positions are tokens the target may take, so each case's law differs)."""
    spec, want, drafted = law_of("T=1", predicting("lookup", case), lambda d: FixedGamma(2),
                                 rule=trusting_verify)
    assert drafted > 0 and total_variation(spec, want) > 1e-3
