"""The in-generation staleness watch (engine/staleness.py) on scripted rounds and fake pairs."""
from __future__ import annotations

import numpy as np
import pytest

from engine.events import DoneEvent, RoundEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.session import Session
from engine.staleness import (MIN_GAP, WINDOW_TOKENS, AcceptanceWatch, StaleDraftEvent,
                              threshold, watch)
from engine.stats import RoundStats
from engine.drafters.draft_model import DraftModelDrafter
from engine.sampling import SamplingParams
from bench.fakes.backend import FakeBackend


def _round(i: int, drafted: int, accepted: int) -> RoundStats:
    return RoundStats(index=i, gamma=drafted, drafted=drafted, accepted=accepted, kind="",
                      committed=accepted + 1, draft_ms=1.0, verify_ms=1.0)


def test_threshold_is_a_margin_below_the_reference():
    assert threshold(0.7, 10_000) == pytest.approx(0.7 - MIN_GAP)
    # A short window needs a wider margin than MIN_GAP.
    assert threshold(0.5, 16) < 0.5 - MIN_GAP
    assert threshold(1.0, 128) == pytest.approx(1.0 - MIN_GAP)


def test_fires_once_after_a_full_window_well_below():
    w = AcceptanceWatch(0.8)
    events = [w.update(_round(i, 4, 1)) for i in range(WINDOW_TOKENS // 4 + 10)]
    fired = [e for e in events if e is not None]
    assert len(fired) == 1
    # Not before the window holds WINDOW_TOKENS drafted tokens.
    assert events.index(fired[0]) == WINDOW_TOKENS // 4 - 1
    assert fired[0].observed == pytest.approx(0.25) and fired[0].drafted == WINDOW_TOKENS


def test_rounds_without_drafts_and_a_short_bad_stretch_do_not_fire():
    w = AcceptanceWatch(0.8)
    for i in range(100):
        assert w.update(_round(i, 0, 0)) is None
    # A bad passage of 40 drafted tokens in a good run stays above the threshold.
    rounds = [_round(i, 4, 4) for i in range(30)] + [_round(i, 4, 0) for i in range(10)] + \
        [_round(i, 4, 4) for i in range(30)]
    assert all(w.update(r) is None for r in rounds)


def test_false_alarms_are_rare_at_the_reference_rate_and_misses_rare_well_below():
    """Rounds of up to 8 drafted tokens accepted while each passes with probability a (the
    geometric run a rejection ends), 300 rounds per generation, 400 generations."""
    rng = np.random.default_rng(0)

    def run(expected: float, actual: float) -> bool:
        w = AcceptanceWatch(expected)
        for i in range(300):
            acc = 0
            while acc < 8 and rng.random() < actual:
                acc += 1
            drafted = min(8, acc + 1)
            if w.update(_round(i, drafted, min(acc, drafted))) is not None:
                return True
        return False

    # The acceptance rate of this process is below the per-token probability; measure it.
    def rate(p: float) -> float:
        d = a = 0
        for _ in range(20_000):
            acc = 0
            while acc < 8 and rng.random() < p:
                acc += 1
            d += min(8, acc + 1)
            a += acc
        return a / d

    ref = rate(0.85)
    assert np.mean([run(ref, 0.85) for _ in range(400)]) < 0.01
    assert np.mean([run(ref, 0.5) for _ in range(100)]) > 0.95


def _gen(draft_noise: float, expected: float):
    target = FakeBackend(n_vocab=32, seed=5)
    draft = FakeBackend(n_vocab=32, seed=5, noise=draft_noise)
    events = generate(Session(target), DraftModelDrafter(draft), [1, 2, 3],
                      GenerationConfig(params=SamplingParams(), gamma=4, max_tokens=200))
    return list(watch(events, expected))


def test_watch_on_a_generation_passes_every_event_and_flags_a_stale_draft():
    good = _gen(0.0, expected=0.95)
    assert not any(isinstance(e, StaleDraftEvent) for e in good)
    assert isinstance(good[-1], DoneEvent) and good[-1].stats.acceptance_rate == 1.0
    bad = _gen(8.0, expected=0.95)
    stale = [e for e in bad if isinstance(e, StaleDraftEvent)]
    assert len(stale) == 1 and stale[0].observed < stale[0].threshold
    # The event follows the round that tripped it, and the text is the same as unwatched.
    i = bad.index(stale[0])
    assert isinstance(bad[i - 1], RoundEvent) and bad[i - 1].round.index == stale[0].round
    assert bad[-1].text == _gen(8.0, expected=None)[-1].text


def test_closing_the_watch_closes_the_generation():
    closed = []

    def events():
        try:
            yield from _gen(0.0, None)
        finally:
            closed.append(True)

    w = watch(events(), 0.9)
    next(w)
    w.close()
    assert closed == [True]
