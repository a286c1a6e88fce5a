"""The generator against scripted fake backends: greedy equality, KV consistency, stops, text."""
from __future__ import annotations

import pytest

from engine.drafters.draft_model import DraftModelDrafter
from engine.events import DoneEvent, RoundEvent, TokenEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.errors import SettingsError
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.backend import FakeBackend, ScriptedDrafter

PROMPT = [3, 14, 15, 9, 26]
GREEDY = SamplingParams(temperature=0.0)


def run(target, drafter, config, check=None):
    events = []
    for ev in generate(target, drafter, PROMPT, config):
        if check is not None and isinstance(ev, RoundEvent):
            check()
        events.append(ev)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return done, events


def baseline_tokens(max_tokens=40, **kw):
    target = Session(FakeBackend(**kw))
    done, _ = run(target, None, GenerationConfig(params=GREEDY, max_tokens=max_tokens))
    return list(done.tokens)


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_speculative_equals_greedy_baseline_for_every_rejection_pattern(gamma):
    expected = baseline_tokens()
    # Wrong at 0..gamma-1, and gamma means "all accepted": every pattern occurs in one run.
    pattern = list(range(gamma + 1)) + [gamma, 0, gamma - 1]
    target = Session(FakeBackend())
    drafter = ScriptedDrafter(FakeBackend(), pattern)
    seq_holder = {}

    def kv_consistent():
        committed = PROMPT + seq_holder["out"]
        assert target.tokens == committed[:-1]
        assert target.backend.cache == target.tokens

    out: list[int] = []
    seq_holder["out"] = out
    config = GenerationConfig(params=GREEDY, gamma=gamma, max_tokens=40)
    events = []
    for ev in generate(target, drafter, PROMPT, config):
        if isinstance(ev, TokenEvent) and ev.token >= 0:
            out.append(ev.token)
        if isinstance(ev, RoundEvent):
            kv_consistent()
        events.append(ev)
    done = events[-1]
    assert list(done.tokens) == expected
    s = done.stats
    assert s.output_tokens == 40
    assert s.target_calls == s.rounds
    assert s.accepted_tokens <= s.drafted_tokens
    kinds = {ev.round.kind for ev in events if isinstance(ev, RoundEvent)}
    assert kinds == {"correction", "bonus"}


def test_draft_model_drafter_keeps_both_caches_consistent_when_sampling():
    target = Session(FakeBackend(seed=0))
    draft_backend = FakeBackend(seed=0, noise=1.5)
    drafter = DraftModelDrafter(draft_backend)
    config = GenerationConfig(params=SamplingParams(temperature=0.8, top_p=0.95, seed=4),
                              gamma=4, max_tokens=60)
    done, events = run(target, drafter, config)
    assert done.stats.output_tokens == 60
    assert 0 < done.stats.acceptance_rate < 1
    assert drafter.session.tokens == draft_backend.cache
    # Beyond the committed text the draft holds at most its own last gamma - 1 proposals.
    committed = PROMPT + list(done.tokens)
    assert drafter.session.common_prefix(committed) >= len(committed) - 4


def test_sampled_speculative_is_reproducible_with_a_seed():
    def once():
        drafter = DraftModelDrafter(FakeBackend(seed=0, noise=1.0))
        config = GenerationConfig(params=SamplingParams(temperature=1.0, seed=123), gamma=3,
                                  max_tokens=30)
        return run(Session(FakeBackend(seed=0)), drafter, config)[0].tokens
    assert once() == once()


def test_stops_on_end_of_generation_token():
    # Token 7 is EOG and forced likely after a few steps by making it the only strong logit.
    backend = FakeBackend(eog=None)
    expected = baseline_tokens(max_tokens=30)
    eog = expected[10]
    target = Session(FakeBackend(eog=None))
    target.backend.is_eog = lambda t: t == eog
    drafter = ScriptedDrafter(FakeBackend(), [1, 4])
    done, _ = run(target, drafter, GenerationConfig(params=GREEDY, gamma=4, max_tokens=30))
    assert list(done.tokens) == expected[:expected.index(eog)]
    assert done.stats.finish_reason == "eos"
    del backend


def test_stop_string_is_not_shown_and_ends_generation():
    base = Session(FakeBackend())
    done, _ = run(base, None, GenerationConfig(params=GREEDY, max_tokens=40))
    text = done.text
    stop = text[12:15]
    target = Session(FakeBackend())
    drafter = ScriptedDrafter(FakeBackend(), [2])
    done2, events = run(target, drafter, GenerationConfig(params=GREEDY, gamma=3, max_tokens=40,
                                                          stop=(stop,)))
    assert done2.text == text[:text.index(stop)]
    assert done2.stats.finish_reason == "stop"
    shown = "".join(ev.text for ev in events if isinstance(ev, TokenEvent))
    assert shown == done2.text


def test_an_until_rule_ends_the_answer_where_it_says_as_a_stop_string_does():
    base = Session(FakeBackend())
    text = run(base, None, GenerationConfig(params=GREEDY, max_tokens=40))[0].text
    seen: list[str] = []

    def until(piece: str) -> bool:
        seen.append(piece)
        return len("".join(seen)) >= 10

    done, _ = run(Session(FakeBackend()), ScriptedDrafter(FakeBackend(), [3]),
                  GenerationConfig(params=GREEDY, gamma=3, max_tokens=40, until=until))
    assert done.stats.finish_reason == "stop" and done.text == "".join(seen)
    assert text.startswith(done.text) and 10 <= len(done.text) < len(text)


def test_multibyte_characters_split_across_tokens_stream_whole():
    from engine.textstream import TextStream
    fb = FakeBackend()
    stream = TextStream(fb.token_bytes)
    parts = [stream.push(t) for t in [0, 60, 61, 1, 62, 63]]
    assert parts == ["a", "", "é", "b", "", "ü"]
    assert stream.finish() == ""
    assert stream.text == "aébü"


def test_stop_string_prefix_is_held_back_until_decided():
    from engine.textstream import TextStream
    fb = FakeBackend()
    stream = TextStream(fb.token_bytes, stop=["bcx"])
    assert stream.push(0) == "a"
    assert stream.push(1) == ""      # "b" may start "bcx"
    assert stream.push(2) == ""      # "bc" too
    assert stream.push(3) == "bcd"   # "bcd" cannot
    assert stream.finish() == ""


def test_statistics_add_up():
    target = Session(FakeBackend())
    drafter = ScriptedDrafter(FakeBackend(), [0, 3, 1, 5])
    done, events = run(target, drafter, GenerationConfig(params=GREEDY, gamma=5, max_tokens=50))
    s = done.stats
    rounds = [ev.round for ev in events if isinstance(ev, RoundEvent)]
    assert sum(r.committed for r in rounds) == s.output_tokens
    assert sum(r.accepted for r in rounds) == s.accepted_tokens
    assert s.drafted_at[0] == len([r for r in rounds if r.drafted > 0])
    assert len(s.origins) == s.output_tokens
    assert s.origins.count("draft") == s.accepted_tokens
    assert s.total_time_ms >= s.decode_time_ms > 0
    assert s.tokens_per_s > 0
    assert s.as_dict()["acceptance_by_position"] == s.acceptance_by_position


def test_baseline_has_one_target_call_per_token():
    target = Session(FakeBackend())
    done, _ = run(target, None, GenerationConfig(params=GREEDY, max_tokens=25))
    assert done.stats.target_calls == 25
    assert all(o == "plain" for o in done.stats.origins)
    assert [c[1] for c in target.backend.calls[1:]] == [1] * 25


def test_second_generation_reuses_the_cached_prompt():
    target = Session(FakeBackend())
    run(target, None, GenerationConfig(params=GREEDY, max_tokens=5))
    n_calls = len(target.backend.calls)
    run(target, None, GenerationConfig(params=GREEDY, max_tokens=5))
    # Same prompt: no prefill decode the second time, only the 5 decode steps.
    assert len(target.backend.calls) - n_calls == 5


def test_statistics_count_the_prompt_tokens_the_cache_held():
    target = Session(FakeBackend())
    first, _ = run(target, None, GenerationConfig(params=GREEDY, max_tokens=5))
    assert (first.stats.prompt_cached_tokens, first.stats.prompt_computed_tokens) == (0, len(PROMPT))
    # The next turn: the prompt, the answer, then more; the cache holds all but the answer's
    # last token (the first round feeds it).
    longer = PROMPT + list(first.tokens) + [7, 8]
    events = list(generate(target, None, longer, GenerationConfig(params=GREEDY, max_tokens=3)))
    stats = events[-1].stats
    assert stats.prompt_cached_tokens == len(PROMPT) + len(first.tokens) - 1
    assert stats.prompt_cached_tokens + stats.prompt_computed_tokens == len(longer) == stats.prompt_tokens


def test_context_overflow_is_a_clear_error():
    target = Session(FakeBackend(n_ctx=4))
    with pytest.raises(SettingsError, match="the prompt needs .* tokens, the context holds 4"):
        run(target, None, GenerationConfig(params=GREEDY, max_tokens=5))


def test_generation_ends_with_length_when_context_fills():
    target = Session(FakeBackend(n_ctx=12))
    done, _ = run(target, ScriptedDrafter(FakeBackend(), [9]), GenerationConfig(
        params=GREEDY, gamma=4, max_tokens=50))
    assert done.stats.finish_reason == "length"
    assert len(PROMPT) + done.stats.output_tokens <= 12 + 1


@pytest.mark.parametrize("gamma", [-1, 99])
def test_bad_gamma_is_refused(gamma):
    with pytest.raises(SettingsError, match="gamma"):
        GenerationConfig(gamma=gamma)
