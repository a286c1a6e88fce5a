"""The suffix drafter and its history index (issue 30): longest matches and their continuation
shares, least-recently-used eviction, the state the store persists, drafting from the context
first and the history second, exactness by enumeration (with a control that must fail), the
history changing only when a generation ends, and the controller's own counts for the history."""
from __future__ import annotations

import numpy as np
import pytest

from engine.control.controller import AdaptiveController
from engine.control.policy import FixedGamma
from engine.dist import Dist
from engine.drafters.history_index import SEP, HistoryIndex
from engine.drafters.hybrid import HybridDrafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter
from engine.drafters.suffix import SuffixDrafter
from engine.events import DoneEvent, RoundEvent
from engine.generator import generate
from engine.generation_config import GenerationConfig
from engine.rng import Rng
from engine.sampling import SamplingParams
from engine.session import Session
from bench.fakes.table import TableFake, VirtualClock
from tests.exact_law import exact_law, target_law, total_variation

V, EOG, N = 8, 7, 3


def lookup(**kw) -> PromptLookupDrafter:
    return PromptLookupDrafter(ngram_max=2, ngram_min=2, is_eog=lambda t: t == EOG, **kw)


# The index -----------------------------------------------------------------------------------

def test_longest_match_wins_and_shares_count_the_occurrences_that_agree():
    h = HistoryIndex()
    h.add([9, 1, 2, 3, 4])
    h.add([8, 1, 2, 3, 5])
    h.add([8, 1, 2, 3, 5])
    h.add([7, 7, 2, 3, 6])
    # "2 3" occurs four times; "1 2 3" three; "8 1 2 3" twice, both followed by 5.
    m = h.match([0, 8, 1, 2, 3], 4)
    assert (m.tokens, m.length, m.occurrences) == ([5], 4, 2)
    assert m.shares == [1.0]
    m = h.match([0, 0, 1, 2, 3], 4)
    assert (m.tokens, m.length, m.occurrences) == ([5], 3, 3)
    assert m.shares == pytest.approx([2 / 3])
    # A continuation never crosses into the next document, and a match never into the last.
    assert h.match([3, 4], 4).tokens == []
    assert h.match([5, 8], 4).tokens == []
    # Below the shortest match worth drafting, or under the share floor: nothing.
    assert h.match([3], 4).tokens == []
    assert h.match([0, 1, 2, 3], 4, min_share=0.9).tokens == []


def test_continuations_follow_the_agreeing_occurrences_and_ties_go_to_the_latest():
    h = HistoryIndex()
    h.add([1, 2, 3, 4, 5])
    h.add([1, 2, 3, 9, 9])
    m = h.match([1, 2], 4)
    assert m.tokens == [3, 9, 9] and m.shares == [1.0, 0.5, 1.0]


def test_lookup_finds_matches_in_a_large_index():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 151_936, 500) for _ in range(200)]
    h = HistoryIndex(capacity=1_000_000)
    for d in docs:
        h.add(d)
    m = h.match([5, *docs[77][100:170]], 8)
    # The match is counted back to MATCH_MAX (64) tokens.
    assert m.tokens == docs[77][170:178].tolist() and m.length == 64
    assert h.n_tokens == 100_000 and h.n_documents == 200


def test_eviction_keeps_the_most_recently_used_documents_within_capacity():
    h = HistoryIndex(capacity=40)
    for first in (1, 11, 21):                    # documents 0, 1, 2: 10 tokens and a separator
        h.add(list(range(first, first + 10)))
    h.touch(0)
    h.add(list(range(31, 41)))                   # 44 > 40: evict to 36, the oldest used first
    assert len(h.tokens) <= 40
    assert h.match([1, 2], 2).tokens == [3, 4]      # used last before the add: kept
    assert h.match([11, 12], 2).tokens == []        # least recently used: gone
    assert h.match([31, 32], 2).tokens == [33, 34]
    # A document larger than the whole index keeps its end.
    h.add(list(range(100, 200)))
    assert len(h.tokens) <= 40 and h.match([197, 198], 1).tokens == [199]


def test_state_round_trips_and_a_malformed_state_is_refused():
    h = HistoryIndex()
    h.add([1, 2, 3, 4])
    h.add([5, 1, 2, 6])
    h.touch(0)
    again = HistoryIndex.restore(h.state(), capacity=1000)
    assert again.match([0, 1, 2], 2) == h.match([0, 1, 2], 2)
    assert again.stamps.tolist() == h.stamps.tolist() and again.clock == h.clock
    bad = h.state()
    bad["tokens"] = bad["tokens"][:-1]
    with pytest.raises(ValueError):
        HistoryIndex.restore(bad, capacity=1000)
    bad = h.state()
    bad["starts"] = np.array([0, 3])
    with pytest.raises(ValueError):
        HistoryIndex.restore(bad, capacity=1000)
    assert SEP in h.state()["tokens"]


# The drafter --------------------------------------------------------------------------------

def test_the_longer_match_wins_and_the_context_wins_a_tie():
    h = HistoryIndex()
    h.add([3, 4, 5, 6, 1, 2, 0, 6])
    d = SuffixDrafter(lookup(), h, is_eog=lambda t: t == EOG)
    rng, params = Rng(0), SamplingParams()
    # "4 5" is in the context: copy from it.
    p = d.draft([4, 5, 2, 4, 5], 3, params, rng)
    assert p.tokens.tolist() == [2, 4, 5] and p.source == "prompt-lookup"
    assert d.plan([4, 5, 2, 4, 5], params).source == "context"
    # Only the history has "3 4 5 6": copy from it.
    p = d.draft([0, 3, 4, 5, 6], 3, params, rng)
    assert p.tokens.tolist() == [1, 2, 0] and p.source == "suffix"
    plan = d.plan([0, 3, 4, 5, 6], params)
    assert plan.source == "history" and plan.is_copy and plan.match == 4
    # The context matches "5 6" (two tokens), the history "3 4 5 6" (four): the history's.
    assert d.plan([5, 6, 2, 3, 4, 5, 6], params).source == "history"
    assert d.draft([5, 6, 2, 3, 4, 5, 6], 3, params, rng).tokens.tolist() == [1, 2, 0]
    # A match shorter than four tokens is too common in a large history to draft from.
    assert h.match([0, 4, 5, 6], 3).tokens == [1, 2, 0]
    assert not d.plan([0, 4, 5, 6], params).drafts
    # Neither: nothing to copy (a plain round); in hybrid the model drafts.
    assert len(d.draft([0, 3], 3, params, rng)) == 0
    assert not d.plan([0, 3], params).drafts
    # The policy's keep reads the history's shares as the draft's own probabilities.
    seen = []
    p = d.draft([0, 3, 4, 5, 6], 3, params, rng,
                  keep=lambda own, sure: seen.append((list(own), sure)) or len(own) < 1)
    assert p.tokens.tolist() == [1] and seen == [([], 1.0), ([1.0], 1.0)]
    # Accepted copies keep their document from eviction.
    stamp = h.stamps[0]
    plan = d.plan([0, 3, 4, 5, 6], params)
    d.feedback(plan, d.propose(plan, 3, params, rng), 1)
    assert h.stamps[0] > stamp


def test_hybrid_with_a_history_copies_before_the_model_drafts():
    h = HistoryIndex()
    h.add([5, 6, 0, 1, 2, 3, 4])
    model = DraftModelDrafter(TableFake(seed=1, eog=EOG))
    hybrid = HybridDrafter(lookup(), model)
    ctx = [6, 0, 1, 2]
    assert hybrid.plan(ctx, SamplingParams()).source == "model"
    with_history = hybrid.with_history(h)
    plan = with_history.plan(ctx, SamplingParams(temperature=1.0))
    assert plan.source == "history" and plan.drafter == "suffix" and not plan.samples
    assert with_history.draft(ctx, 2, SamplingParams(), Rng(0)).tokens.tolist() == [3, 4]
    assert hybrid.copy is hybrid.lookup  # the pair's own drafter is unchanged
    # A round priced as a copy never falls back to the model: when the copy's stop declines its
    # first token, it drafts nothing.
    none = with_history.draft(ctx, 2, SamplingParams(), Rng(0), keep=lambda own, sure: False)
    assert len(none) == 0 and none.source == "suffix"


# Exactness ----------------------------------------------------------------------------------

PROMPT = [0, 1, 2, 3, 4, 5, 6, 2]


def history() -> HistoryIndex:
    """Documents that continue the prompt's end and one another in several ways, so copies
    are drafted, disagree, and carry shares below 1."""
    h = HistoryIndex()
    rng = np.random.default_rng(3)
    for d in ([4, 5, 6, 2, 4, 1, 3, 0], [4, 5, 6, 2, 4, 5, 0, 1], [4, 5, 6, 2, 1, 1, 1, 4],
              [5, 6, 2, 4, 1, 0, 2, 3], [6, 2, 4, 1, 3, 3, 5, 0]):
        h.add(d)
    for _ in range(6):
        h.add(rng.integers(0, EOG, 8))
    return h


class SharesAsQ(SuffixDrafter):
    """The control: the history's shares passed as the draft's q rows (share on the copied
    token, the rest spread), although the tokens were not drawn from them."""

    def propose(self, plan, gamma, params, rng, keep=None):
        p = super().propose(plan, gamma, params, rng, keep)
        if p.source != "suffix":
            return p
        rows = []
        for x, s in zip(p.tokens.tolist(), plan.shares):
            w = np.full(V, (1.0 - s) / (V - 1))
            w[x] = s
            rows.append(Dist.sparse(V, np.arange(V), w))
        p.q = rows
        return p


def law(params: SamplingParams, build, policy) -> tuple[float, int]:
    """(TV to the target's law, leaves that copied from the history)."""
    from_history = [0]

    def run(rng: Rng):
        clock = VirtualClock()
        target = Session(TableFake(seed=1, eog=EOG, clock=clock, cost=[10.0, 11.0, 12.0]))
        events = list(generate(target, build(), PROMPT, GenerationConfig(params=params, gamma=2,
                                                                         max_tokens=N),
                               policy(), rng=rng, clock=clock.now))
        from_history[0] += any(isinstance(e, RoundEvent) and e.round.source == "suffix"
                               and e.round.drafted for e in events)
        return next(e for e in events if isinstance(e, DoneEvent)).tokens

    spec = exact_law(run)
    want = target_law(TableFake(seed=1, eog=EOG), PROMPT, params, N)
    return total_variation(spec, want), from_history[0]


def adaptive():
    return AdaptiveController(max_gamma=2, draft_ms=[0.0] * 3, verify_ms=[10.0, 11.0, 12.0],
                              opening=())


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["T=1", "T=0.7 top-p 0.9"])
@pytest.mark.parametrize("policy", [lambda: FixedGamma(2), adaptive], ids=["fixed", "adaptive"])
def test_copies_from_the_history_keep_the_targets_law_exactly(params, policy):
    tv, copied = law(params, lambda: SuffixDrafter(lookup(), history(), is_eog=lambda t: t == EOG),
                     policy)
    assert tv < 1e-9 and copied > 0


def test_the_control_reading_shares_as_q_is_caught():
    tv, copied = law(SamplingParams(temperature=1.0),
                     lambda: SharesAsQ(lookup(), history(), is_eog=lambda t: t == EOG),
                     lambda: FixedGamma(2))
    assert copied > 0 and tv > 1e-3


# The history over generations ---------------------------------------------------------------

def test_a_generation_drafts_from_the_history_as_it_began_and_adds_itself_when_it_ends():
    h = HistoryIndex()
    target = Session(TableFake(seed=1, eog=EOG))
    config = GenerationConfig(params=SamplingParams(), gamma=2, max_tokens=6)
    drafter = SuffixDrafter(lookup(), is_eog=lambda t: t == EOG)

    def run():
        events = list(generate(target, drafter, PROMPT, config, FixedGamma(2), history=h))
        rounds = [e.round for e in events if isinstance(e, RoundEvent)]
        return next(e for e in events if isinstance(e, DoneEvent)), rounds

    first, rounds = run()
    assert not any(r.source == "suffix" and r.drafted for r in rounds)
    assert h.n_documents == 1 and h.n_tokens >= len(PROMPT) + len(first.tokens)
    again, rounds = run()
    # Greedy: the same answer, now copied from the history.
    assert again.tokens == first.tokens
    assert sum(r.accepted for r in rounds if r.source == "suffix") > 0
    assert h.n_documents == 2
    # Plain decoding learns too.
    list(generate(target, None, PROMPT, config, history=h))
    assert h.n_documents == 3


def test_the_controller_keeps_counts_per_source_and_match_length():
    from engine.round_plan import RoundPlan
    from engine.stats import RoundStats
    c = AdaptiveController(max_gamma=4, draft_ms=[0.0] * 5, verify_ms=[10.0, 11, 12, 13, 14],
                           opening=())
    history = RoundPlan("history", "suffix", tokens=(1, 2, 3, 4), match=5)
    d = c.next_gamma(history)
    assert d.plan == history and "past requests" in d.reason
    c.update(d, RoundStats(index=1, gamma=d.gamma, drafted=max(d.gamma, 1), accepted=0,
                           kind="correction", committed=1, draft_ms=0.0, verify_ms=12.0,
                           source="suffix"))
    assert c.estimator.counts("history@4-7").tries[0] > 0
    # Another bucket of the same source, and the context's, know nothing of it.
    context = RoundPlan("context", "prompt-lookup", tokens=(1, 2), match=5)
    assert c.estimator.counts("history@16+").empty and c.estimator.counts("context@4-7").empty
    assert c.acceptance(history)[0] < c.acceptance(context)[0]


def test_a_lookups_key_is_the_indexs_key():
    from engine.drafters.history_index import _key4, _keys
    rng = np.random.default_rng(0)
    for t in rng.integers(0, 300_000, (200, 4)):
        assert _key4(*t.tolist()) == int(_keys(t.astype(np.int64), np.array([3]))[0])
