"""Copies that learn the edit's renames (engine/drafters/substitutions.py): a rename is learnt
after one occurrence and drafted at the next, from the context (prompt lookup) and from a
prediction; a pair the answer stops following is dropped, one learnt again is replaced; text
that departs without rejoining teaches nothing; the pairs do not depend on how the text came in.
"""
from __future__ import annotations

from engine.drafters.prediction import PredictionDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.substitutions import PAIRS_MAX, SPAN_MAX, Alignment, Substitutions
from engine.round_plan import PREDICTION
from engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
OLD, NEW = (50, 51), (60, 61, 62)
# A source with the old name three times, each in different surroundings.
SOURCE = [1, 2, 3, *OLD, 4, 5, 6, 7, 8, 9, *OLD, 10, 11, 12, 13, 14, 15, *OLD, 16, 17, 18, 19]
# The answer renames it: up to three tokens past the first new name.
HEADER = [90, 91]


def renamed(upto: int) -> list[int]:
    """The edited source's first `upto` tokens (OLD renamed to NEW everywhere)."""
    out: list[int] = []
    i = 0
    while i < len(SOURCE):
        if tuple(SOURCE[i:i + 2]) == OLD:
            out.extend(NEW)
            i += 2
        else:
            out.append(SOURCE[i])
            i += 1
    return out[:upto]


def lookup_plan(answer: list[int], drafter: PromptLookupDrafter | None = None,
                steps: int = 1) -> tuple[PromptLookupDrafter, tuple[int, ...]]:
    """Prompt lookup's copy after SOURCE + HEADER + `answer`, the answer committed in `steps`
    chunks (a plan after each, as rounds make them)."""
    drafter = drafter or PromptLookupDrafter(ngram_max=3, ngram_min=2)
    context = [*SOURCE, *HEADER]
    drafter.plan(context, GREEDY)
    cut = max(1, len(answer) // steps)
    for i in range(0, len(answer), cut):
        context.extend(answer[i:i + cut])
        plan = drafter.plan(context, GREEDY)
    return drafter, plan.tokens


def pairs(drafter: PromptLookupDrafter) -> dict:
    assert drafter._alignment is not None
    return drafter._alignment.substitutions.pairs


def test_a_rename_is_learnt_after_one_occurrence_and_drafted_at_the_next():
    # Before the first new name is followed by REALIGN source tokens, nothing is learnt, and
    # the copy drafts the old name.
    drafter, tokens = lookup_plan(renamed(3 + 3 + 2))
    assert not pairs(drafter)
    # Three tokens past it the answer has rejoined: the copy drafts the next occurrence renamed
    # and goes on copying after it.
    drafter, tokens = lookup_plan(renamed(3 + 3 + 3))
    assert pairs(drafter) == {OLD: NEW}
    rest = tuple(renamed(len(SOURCE) + 3))[9:]
    assert tokens[:len(rest)] == rest and tokens[3:6] == NEW and rest.count(NEW[0]) == 2


def test_the_pairs_do_not_depend_on_how_the_rounds_cut_the_text():
    answer = renamed(20)
    learnt = [pairs(lookup_plan(answer, steps=k)[0]) for k in (1, 3, 7, 20)]
    assert learnt == [{OLD: NEW}] * 4


def test_a_pair_the_answer_stops_following_is_dropped():
    # The answer renames the first occurrence, then writes the second as it stands.
    answer = renamed(9) + SOURCE[8:8 + 6 + 2 + 2]
    drafter, tokens = lookup_plan(answer)
    assert not pairs(drafter)
    assert tokens[:3] == (15, *OLD)


def test_a_pair_learnt_again_for_the_same_span_replaces_it():
    other = (70,)
    answer = renamed(9) + SOURCE[8:11] + [*other] + SOURCE[13:16]
    drafter, tokens = lookup_plan(answer)
    assert pairs(drafter) == {OLD: other}
    assert tokens[:4] == (13, 14, 15, *other)


def test_text_that_departs_without_rejoining_learns_nothing():
    # The answer follows the source, then writes something else for longer than a span.
    answer = SOURCE[:4] + list(range(100, 100 + SPAN_MAX + 6))
    drafter, _ = lookup_plan(answer)
    assert not pairs(drafter)
    # A departure that rejoins further than SPAN_MAX into the source is no substitution either.
    answer = SOURCE[:3] + [99] + SOURCE[3 + SPAN_MAX + 1:3 + SPAN_MAX + 5]
    drafter, _ = lookup_plan(answer)
    assert not pairs(drafter)


def test_the_plain_copy_is_unchanged_without_a_pair():
    answer = SOURCE[:6]
    drafter, tokens = lookup_plan(answer)
    assert not pairs(drafter) and tokens == (*SOURCE[6:], *HEADER, *answer)


def test_a_prediction_learns_and_drafts_the_rename():
    prompt = [*SOURCE[:2], *HEADER]
    drafter = PredictionDrafter(PromptLookupDrafter(ngram_max=3, ngram_min=2), SOURCE, prompt)
    context = list(prompt)
    drafter.plan(context, GREEDY)
    context.extend(renamed(9))
    plan = drafter.plan(context, GREEDY)
    assert plan.source == PREDICTION
    assert plan.tokens[3:6] == NEW and plan.tokens[:3] == (7, 8, 9)


def test_most_recent_pair_wins_and_the_pairs_are_bounded():
    subs = Substitutions()
    subs.learn((1, 2), (7,))
    subs.learn((1,), (8,))
    assert subs.rewrite([1, 2, 3], 0, 3, 10) == [8, 2, 3]
    subs.learn((1, 2), (9,))
    assert subs.rewrite([1, 2, 3], 0, 3, 10) == [9, 3]
    # An S cut by the copy's end is left as it stands.
    assert subs.rewrite([0, 1], 0, 2, 10) == [0, 8]
    subs.drop((1,))
    assert subs.rewrite([0, 1], 0, 2, 10) == [0, 1]
    for t in range(20, 20 + PAIRS_MAX):
        subs.learn((t,), (t + 1,))
    assert len(subs) == PAIRS_MAX and (1, 2) not in subs.pairs


def test_an_alignment_against_another_text_learns_the_worked_example():
    """The module docstring's example: the answer (after two prompt tokens) follows the source
    after its 5 (where `locate` puts it), writes 7 for 1 and rejoins at 2 3 4."""
    source = [5, 1, 2, 3, 4, 6, 1, 2, 8]
    text = [9, 9, 5]
    alignment = Alignment(source, text, 0, lambda i: 1 if i == 2 else -1)
    for token in (7, 2, 3):
        text.append(token)
        alignment.update()
        assert not alignment.substitutions.pairs
    text.append(4)
    alignment.update()
    assert alignment.substitutions.pairs == {(1,): (7,)}
    assert alignment.substitutions.rewrite(source, 5, 9, 64) == [6, 7, 2, 8]
