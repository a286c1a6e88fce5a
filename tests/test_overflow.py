"""The overflow policies (app/runtime/overflow.py) over a counter of words: what each keeps,
what it leaves out, what it says, and when it refuses."""
from __future__ import annotations

import pytest

from app.runtime.overflow import (DROP_OLDEST, STOP, TRUNCATE_MIDDLE, candidates, fit, reserve,
                                  split_turns)
from engine.errors import PromptTooLongError

SYSTEM = {"role": "system", "content": "be brief"}


def chat(*texts: str, system: bool = True) -> list[dict]:
    msgs = [SYSTEM] if system else []
    return msgs + [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                   for i, t in enumerate(texts)]


def words(messages: list[dict]) -> list[int]:
    """A token per word, one more per message (its template)."""
    return [0] * sum(len(m["content"].split()) + 1 for m in messages)


def contents(messages) -> list[str]:
    return [m["content"] for m in messages]


def test_turns_open_at_each_user_message_after_the_system_prompt():
    system, turns = split_turns(chat("a", "b", "c"))
    assert system == [SYSTEM] and [contents(t) for t in turns] == [["a", "b"], ["c"]]


def test_a_chat_that_fits_is_sent_whole():
    msgs = chat("one two", "three")
    out = fit(msgs, DROP_OLDEST, words, budget=100)
    assert list(out.messages) == msgs and out.dropped == () and out.note(DROP_OLDEST) == ""
    assert len(out.tokens) == len(words(msgs))


def test_drop_oldest_keeps_the_system_prompt_and_the_newest_turns():
    msgs = chat("q1 q1 q1", "a1 a1 a1", "q2 q2", "a2 a2", "q3")
    # Whole: 2 + 4 + 4 + 3 + 3 + 2 = 18; without turn 1: 10; without turns 1-2: 4.
    out = fit(msgs, DROP_OLDEST, words, budget=12)
    assert contents(out.messages) == ["be brief", "q2 q2", "a2 a2", "q3"]
    assert contents(out.dropped) == ["q1 q1 q1", "a1 a1 a1"]
    assert out.note(DROP_OLDEST) == ("left out the oldest 1 turn (2 messages) to fit the context; "
                                     "the system prompt is kept")
    assert contents(fit(msgs, DROP_OLDEST, words, budget=5).messages) == ["be brief", "q3"]


def test_truncate_middle_keeps_the_first_turn_until_only_the_newest_fits():
    msgs = chat("q1", "a1", "q2 q2 q2", "a2 a2 a2", "q3 q3", "a3", "q4")
    out = fit(msgs, TRUNCATE_MIDDLE, words, budget=14)
    assert contents(out.messages) == ["be brief", "q1", "a1", "q3 q3", "a3", "q4"]
    assert contents(out.dropped) == ["q2 q2 q2", "a2 a2 a2"]
    assert "middle 1 turn" in out.note(TRUNCATE_MIDDLE)
    assert contents(fit(msgs, TRUNCATE_MIDDLE, words, budget=9).messages) == ["be brief", "q1", "a1", "q4"]
    assert contents(fit(msgs, TRUNCATE_MIDDLE, words, budget=5).messages) == ["be brief", "q4"]


def test_stop_refuses_with_what_to_do():
    with pytest.raises(PromptTooLongError, match="start a new chat, choose another overflow policy"):
        fit(chat("a b c", "d e f", "g"), STOP, words, budget=5)


@pytest.mark.parametrize("policy", [DROP_OLDEST, TRUNCATE_MIDDLE])
def test_a_newest_message_too_long_alone_is_refused(policy):
    with pytest.raises(PromptTooLongError, match="newest message alone needs 8 tokens"):
        fit(chat("a", "b", "one two three four"), policy, words, budget=6)


def test_each_choice_leaves_out_more_than_the_one_before():
    msgs = chat(*[f"m{i}" for i in range(9)])
    for policy in (DROP_OLDEST, TRUNCATE_MIDDLE):
        sizes = [len(kept) for kept, _ in candidates(msgs, policy)]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    with pytest.raises(ValueError, match="must be one of"):
        candidates(msgs, "rolling")


def test_the_answer_keeps_at_most_half_the_context():
    assert reserve(256, 4096) == 256 and reserve(4000, 4096) == 2048 and reserve(0, 16) == 1
