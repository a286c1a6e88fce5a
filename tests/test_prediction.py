"""Predicted outputs in the engine (engine/drafters/prediction.py): the prediction drafts where
nothing else would, before the drafter it wraps, resumes after the answer departs from it and
rejoins, is counted in the statistics, and leaves the answer the target's."""
from __future__ import annotations

from bench.fakes.backend import FakeBackend
from engine.control.policy import FixedGamma
from engine.drafters.prediction import PREDICTION_DRAFTER, PredictionDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.generator import generate
from engine.round import NoDrafter
from engine.round_plan import CONTEXT, NO_PLAN, PREDICTION
from engine.sampling import SamplingParams
from engine.session import Session

GREEDY = SamplingParams(temperature=0.0)
# A prompt whose answer (on this fake, greedy) repeats none of its n-grams: lookup has nothing.
PROMPT = list(range(10, 30))
LENGTH = 18


def run(drafter, prediction=(), gamma: int = 4, params: SamplingParams = GREEDY) -> DoneEvent:
    target = Session(FakeBackend(n_vocab=64, seed=3))
    config = GenerationConfig(params=params, gamma=gamma, max_tokens=LENGTH)
    events = list(generate(target, drafter, PROMPT, config, FixedGamma(gamma) if gamma else None,
                           prediction=prediction))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done


def lookup() -> PromptLookupDrafter:
    return PromptLookupDrafter(ngram_max=3, ngram_min=2)


def test_the_prediction_drafts_where_prompt_lookup_has_nothing():
    plain = run(None, gamma=0)
    alone = run(lookup())
    assert alone.stats.drafted_tokens == 0 and alone.stats.target_calls == LENGTH
    predicted = run(lookup(), prediction=plain.tokens)
    assert predicted.tokens == plain.tokens
    s = predicted.stats
    assert s.accepted_prediction_tokens == LENGTH - s.target_calls > 0
    assert s.rejected_prediction_tokens == 0
    assert s.drafted_by == {PREDICTION_DRAFTER: s.accepted_prediction_tokens}
    # The wrapped drafter is still the one the statistics name.
    assert s.drafter == "prompt-lookup"


def test_a_wrong_token_is_rejected_counted_and_copying_resumes():
    plain = run(None, gamma=0)
    wrong = list(plain.tokens)
    wrong[8] = 0
    done = run(lookup(), prediction=wrong)
    s = done.stats
    assert done.tokens == plain.tokens
    assert s.rejected_prediction_tokens > 0
    # After the rejection the text's last 3 tokens occur in the prediction again (past the
    # wrong one), and the rest is copied.
    assert s.accepted_prediction_tokens >= LENGTH - 8 - 4
    assert s.accepted_prediction_tokens + s.rejected_prediction_tokens == s.drafted_tokens


def test_an_answer_that_departs_and_rejoins_copies_again():
    """A prediction with an inserted run: the answer leaves it and comes back."""
    plain = run(None, gamma=0)
    edited = [*plain.tokens[:6], 60, 61, 62, *plain.tokens[6:]]
    d = PredictionDrafter(lookup(), edited, PROMPT)
    answer = [*PROMPT, *plain.tokens[:9]]
    plan = d.plan(answer, GREEDY)
    # The answer's last three tokens follow the inserted run in the prediction.
    assert plan.source == PREDICTION and plan.tokens[:3] == tuple(plain.tokens[9:12])
    assert plan.match >= 3


def test_the_first_round_copies_the_prediction_from_its_start():
    d = PredictionDrafter(lookup(), [40, 41, 42], PROMPT)
    plan = d.plan(PROMPT, GREEDY)
    assert plan.source == PREDICTION and plan.tokens == (40, 41, 42)
    # The prompt's end agrees by construction: it counts for the n-gram alone, and the match
    # grows as the answer follows the prediction.
    assert plan.match == 3
    assert d.plan([*PROMPT, 40, 41], GREEDY).match == 5


def test_where_the_prediction_has_no_match_the_wrapped_drafter_plans():
    prompt = [1, 2, 3, 9, 1, 2, 3]
    d = PredictionDrafter(lookup(), [40, 41, 42], prompt)
    assert d.plan([*prompt, 7, 7, 8], GREEDY) == lookup().plan([*prompt, 7, 7, 8], GREEDY)
    assert d.plan([*prompt, 5, 9, 1, 2], GREEDY).source == CONTEXT
    # The prompt's own text is lookup's to copy, not the prediction's: over a drafter with
    # nothing to draft, a match inside the prompt plans nothing.
    assert PredictionDrafter(NoDrafter(), [40], prompt).plan([*prompt, 2, 3, 9], GREEDY) is NO_PLAN


def test_the_occurrence_that_agrees_further_back_is_copied():
    """A repeated n-gram: the copy follows the occurrence the text agrees with longer."""
    prediction = [50, 51, 1, 2, 3, 60, 52, 53, 1, 2, 3, 61]
    d = PredictionDrafter(lookup(), prediction, PROMPT)
    assert d.plan([*PROMPT, 52, 53, 1, 2, 3], GREEDY).tokens[0] == 61
    assert d.plan([*PROMPT, 50, 51, 1, 2, 3], GREEDY).tokens[0] == 60


def test_plain_decoding_has_nothing_to_draft_with_a_prediction():
    plain = run(None, gamma=0)
    with_one = run(None, prediction=plain.tokens, gamma=0)
    assert with_one.tokens == plain.tokens
    assert with_one.stats.target_calls == LENGTH
    assert with_one.stats.accepted_prediction_tokens == with_one.stats.rejected_prediction_tokens == 0

