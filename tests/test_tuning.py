"""`tandem tune`'s loop and decision on scripted hosts and on a fake pair (no model files)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench.benchmark.suite import SuitePrompt
from engine.errors import ModelFileError
from engine.backend import ModelConfig
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.stats import GenerationStats
from bench.tuning.candidates import default_candidates
from models.candidate import Candidate
from bench.tuning.decide import OVERALL, categories, choose, table
from bench.tuning.host import PairHost
from bench.tuning.measure import (MIN_PAIRS_TO_STOP, TuneHost, clearly_loses, leader_median,
                                   measure)
from bench.fakes.table import TableFake, VirtualClock

PROMPTS = [SuitePrompt(f"{c}-{i}", c, f"prompt {c} {i}") for i in range(4)
           for c in ("code", "chat")]


class ScriptedHost(TuneHost):
    """Plain decoding at 10 tok/s; a candidate at 10 x its speedup for the prompt's category.
    Each run costs `run_s` seconds of the fake clock."""

    def __init__(self, speedups: dict[str, dict[str, float]], run_s: float = 1.0,
                 broken: tuple[str, ...] = ()) -> None:
        self.speedups, self.run_s, self.broken = speedups, run_s, broken
        self.t = 0.0
        self.log: list[str] = []
        self.opened: list[str] = []

    def now(self) -> float:
        return self.t

    def open(self, c: Candidate) -> None:
        if c.name in self.broken:
            raise ModelFileError(f"cannot derive {c.name}")
        self.opened.append(c.name)

    def run(self, c, prompt, params) -> GenerationStats:
        self.t += self.run_s
        self.log.append(c.name if c else "plain")
        tps = 10.0 * (self.speedups[c.name][prompt.category] if c else 1.0)
        return GenerationStats(output_tokens=64, decode_time_ms=64 / tps * 1e3,
                               drafted_tokens=40 if c else 0, accepted_tokens=30 if c else 0,
                               draft_time_ms=400.0 if c else 0.0)

    def close(self, c: Candidate) -> None:
        self.opened.remove(c.name)


def _cands(*names: str) -> list[Candidate]:
    return [Candidate("draft", draft_quant=n) if n != "lookup" else Candidate("lookup")
            for n in names]


def test_the_fastest_per_category_wins_and_nothing_slower_than_plain_is_picked():
    host = ScriptedHost({"draft-q8_0": {"code": 1.5, "chat": 0.8},
                         "draft-q4_0": {"code": 1.3, "chat": 0.9},
                         "lookup": {"code": 1.1, "chat": 0.95}})
    results = measure(host, _cands("q8_0", "q4_0", "lookup"), PROMPTS, SamplingParams(),
                      budget_s=1e6, now=host.now)
    assert choose(results, "code").candidate.name == "draft-q8_0"
    # Every candidate loses on chat: plain decoding ("plain") is the answer there.
    assert choose(results, "chat") is None
    assert categories(results) == ["code", "chat"]
    rows = {r.candidate.name: r for r in table(results)}
    assert rows["draft-q8_0"].acceptance == pytest.approx(0.75)
    # 400 ms over 40 drafted tokens, against plain's 100 ms per token.
    assert rows["draft-q8_0"].draft_cost == pytest.approx(0.1)
    assert not host.opened  # every candidate was closed


def test_runs_are_interleaved_and_alternate_order():
    host = ScriptedHost({"lookup": {"code": 1.2, "chat": 1.2}})
    measure(host, _cands("lookup"), PROMPTS[:4], SamplingParams(), budget_s=1e6, now=host.now)
    assert host.log == ["plain", "lookup", "lookup", "plain", "plain", "lookup", "lookup", "plain"]


def test_a_candidate_slower_everywhere_stops_after_the_minimum():
    host = ScriptedHost({"draft-q8_0": {"code": 0.7, "chat": 0.6},
                         "lookup": {"code": 1.2, "chat": 1.2}})
    results = measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=1e6,
                      now=host.now)
    assert len(results[0].runs) == MIN_PAIRS_TO_STOP
    assert "slower than plain" in results[0].stopped
    assert len(results[1].runs) == len(PROMPTS) and not results[1].stopped


def test_a_candidate_behind_the_leader_on_every_prompt_stops():
    host = ScriptedHost({"draft-q8_0": {"code": 2.0, "chat": 2.0},
                         "lookup": {"code": 1.2, "chat": 1.3}})
    results = measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=1e6,
                      now=host.now)
    assert len(results[1].runs) == MIN_PAIRS_TO_STOP
    assert "leader" in results[1].stopped


def test_early_stop_rule():
    assert clearly_loses([0.9, 0.8], None) == ""
    assert clearly_loses([0.9, 0.8, 0.95], None)
    assert clearly_loses([0.9, 1.1, 0.95], None) == ""
    assert clearly_loses([1.1, 1.2, 1.15], 1.3)
    assert clearly_loses([1.1, 1.4, 1.15], 1.3) == ""


def test_leader_needs_enough_pairs_and_to_beat_plain():
    from bench.tuning.measure import CandidateResult, PairRun
    def res(speedups):
        r = CandidateResult(Candidate("lookup"))
        r.runs = [PairRun("p", "c", 10.0, 10.0 * s, 0, 0, 0.0, 100.0) for s in speedups]
        return r
    assert leader_median([res([2.0, 2.0])]) is None
    assert leader_median([res([0.9, 0.9, 0.9])]) is None
    assert leader_median([res([1.5, 1.2, 1.4]), res([1.1, 1.1, 1.1])]) == pytest.approx(1.4)


def test_the_budget_is_shared_and_every_candidate_gets_a_pair():
    host = ScriptedHost({n: {"code": 1.2, "chat": 1.2}
                         for n in ("draft-q8_0", "draft-q4_0", "lookup")}, run_s=10.0)
    # 60 s: 20 s a candidate, one pair (2 runs of 10 s) each.
    results = measure(host, _cands("q8_0", "q4_0", "lookup"), PROMPTS, SamplingParams(),
                      budget_s=60.0, now=host.now)
    assert [len(r.runs) for r in results] == [1, 1, 1]
    assert all("budget" in r.stopped for r in results)
    # Even a spent budget measures each remaining candidate once.
    results = measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=0.0,
                      now=host.now)
    assert [len(r.runs) for r in results] == [1, 1]


def test_progress_reports_expected_pairs_and_time_left():
    host = ScriptedHost({n: {"code": 1.2, "chat": 1.2} for n in ("draft-q8_0", "lookup")})
    seen = []
    measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=1e6,
            now=host.now, progress=seen.append)
    assert [p.done for p in seen] == list(range(1, 2 * len(PROMPTS) + 1))
    assert all(p.expected == 2 * len(PROMPTS) for p in seen)
    # Two seconds a pair: the estimate is the pairs left times that.
    assert [p.eta_s for p in seen] == [2.0 * (2 * len(PROMPTS) - p.done) for p in seen]
    assert seen[-1].eta_s == 0.0


def test_a_candidate_that_cannot_load_is_reported_and_never_chosen():
    host = ScriptedHost({"draft-q8_0": {"code": 5.0, "chat": 5.0},
                         "lookup": {"code": 1.1, "chat": 1.1}}, broken=("draft-q8_0",))
    results = measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=1e6,
                      now=host.now)
    assert "cannot derive" in results[0].error and not results[0].runs
    assert choose(results, OVERALL).candidate.name == "lookup"
    assert table(results)[0].note == results[0].error


def test_default_candidates():
    names = [c.name for c in default_candidates(True, 28)]
    assert names == ["draft", "hybrid", "draft-q8_0", "draft-q4_k", "draft-q4_0",
                     "draft-vocab-trim", "lookup", "suffix", "early-exit-17", "early-exit-21"]
    assert [c.name for c in default_candidates(False, 1)] == ["lookup", "suffix"]


def test_pair_host_measures_a_fake_pair_on_a_virtual_clock():
    """The loop over a real Pair of fakes: a draft equal to the target is accepted always and,
    costing a tenth of the target, beats plain decoding; greedy output is the same either way."""
    clock = VirtualClock()
    target = TableFake(n_vocab=8, seed=3, clock=clock, cost=[30.0 + 3.0 * w for w in range(10)])
    draft = TableFake(n_vocab=8, seed=3, clock=clock, cost=[3.0] * 10)
    pair = Pair(target, draft, clock=clock.now)
    host = PairHost(pair, ModelConfig("unused.gguf"), None, max_tokens=24)
    results = measure(host, [Candidate("draft"), Candidate("lookup")], PROMPTS[:3],
                      SamplingParams(), budget_s=1e9, now=lambda: clock.now() / 1e3)
    rows = {r.candidate.name: r for r in table(results)}
    assert rows["draft"].acceptance == 1.0
    assert rows["draft"].speedup.median > 1.5
    assert choose(results).candidate.name == "draft"
    assert 0.0 < rows["draft"].draft_cost < 0.5
    assert np.isfinite(rows["lookup"].speedup.median)


def test_a_win_within_noise_or_without_drafting_is_not_chosen():
    host = ScriptedHost({"draft-q8_0": {"code": 1.02, "chat": 1.02},
                         "lookup": {"code": 1.5, "chat": 1.5}})
    results = measure(host, _cands("q8_0", "lookup"), PROMPTS, SamplingParams(), budget_s=1e6,
                      now=host.now)
    for res in results:
        if res.candidate.name == "lookup":
            res.runs = [replace(r, drafted=0, accepted=0) for r in res.runs]
    # lookup's 1.5x never drafted (it was plain decoding); q8_0's 1.02x is inside the noise.
    assert choose(results, OVERALL) is None


def test_the_suffix_candidate_drafts_from_earlier_prompts_never_from_its_own_earlier_run():
    pair = Pair(TableFake(n_vocab=8, seed=3))
    host = PairHost(pair, ModelConfig("unused.gguf"), None, max_tokens=8)
    c = Candidate("suffix")
    host.open(c)
    before = host._histories[c].n_documents
    for _ in range(2):
        host.run(c, PROMPTS[0], SamplingParams())
    assert host._histories[c].n_documents == before + 1
    host.run(c, PROMPTS[1], SamplingParams())
    assert host._histories[c].n_documents == before + 2
    # Candidates that read no history get none.
    assert host._history(Candidate("lookup"), PROMPTS[2]) is None
