"""The benchmark runner and report writers on fake backends."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from app.reports import bench_markdown, bench_plots
from bench.benchmark import files as bench_files
from engine.events import DoneEvent
from engine.grammar.spec import GrammarSpec
from bench.benchmark.aggregate import summarize
from bench.fakes.spelled import SpelledBackend, byte_spelling
from bench.overhead.banks import llm_like_bank
from bench.benchmark.runner import BenchPlan, SpecConfig, cold_start, run_benchmark
from bench.benchmark.suite import SuitePrompt, load_suite
from engine.errors import SettingsError
from engine.pair import Pair
from engine.sampling import SamplingParams
from bench.fakes.backend import FakeBackend

GREEDY = SamplingParams()


def fake_pair() -> Pair:
    return Pair(FakeBackend(seed=3), FakeBackend(seed=3, noise=0.5))


def prompts(n_per_cat=1, cats=("math", "code-editing")):
    return load_suite().select(list(cats), n_per_cat).prompts


def test_every_speculative_run_is_paired_with_its_own_baseline_and_order_alternates():
    pair = fake_pair()
    plan = BenchPlan(prompts=prompts(2), samplings=[GREEDY, SamplingParams(temperature=0.7, top_p=0.9)],
                     configs=[SpecConfig("draft", 2), SpecConfig("draft", 4)], max_tokens=12)
    seen = []
    records = run_benchmark(pair, plan, lambda done, total, rec: seen.append((done, total)))
    assert len(records) == plan.total_runs == 4 * 2 * 3
    assert seen[-1] == (plan.total_runs, plan.total_runs)
    by_order = {r.order: r for r in records}
    assert sorted(by_order) == list(range(len(records)))
    roles = [r.role for r in records]
    # Groups alternate baseline-first and baseline-last.
    assert roles[:3] == ["baseline", "speculative", "speculative"]
    assert roles[3:6] == ["speculative", "speculative", "baseline"]
    for r in records:
        if r.role == "speculative":
            b = by_order[r.baseline_order]
            assert (b.role, b.prompt_id, b.temperature, b.top_p, b.seed) == \
                   ("baseline", r.prompt_id, r.temperature, r.top_p, r.seed)
            assert r.speedup == pytest.approx(r.tokens_per_s / b.tokens_per_s)
            assert r.drafted_tokens > 0 and r.target_calls < r.output_tokens + 1
            assert len(r.origins) == r.output_tokens
        else:
            assert r.speedup is None and r.drafter == "plain" and r.target_calls == r.output_tokens
        assert r.prefill_ms > 0 and r.ttft_ms >= r.prefill_ms and r.total_ms >= r.ttft_ms


def test_repeats_pair_the_median_speeds_and_count_each_prompt_once():
    pair = fake_pair()
    plan = BenchPlan(prompts=prompts(1), samplings=[GREEDY], configs=[SpecConfig("draft", 2)],
                     max_tokens=12, repeats=3)
    records = run_benchmark(pair, plan)
    assert len(records) == plan.total_runs == 2 * 2 * 3
    for pid in {r.prompt_id for r in records}:
        mine = [r for r in records if r.prompt_id == pid]
        assert sorted(r.role for r in mine) == ["baseline", "baseline-repeat", "baseline-repeat",
                                                "speculative", "speculative-repeat",
                                                "speculative-repeat"]
        base = sorted(r.tokens_per_s for r in mine if r.role.startswith("baseline"))[1]
        spec = sorted(r.tokens_per_s for r in mine if r.role.startswith("speculative"))[1]
        for r in mine:
            if r.role.startswith("speculative"):
                assert r.speedup == pytest.approx(spec / base)
    # The aggregates see one speedup per prompt, not one per repeat.
    overall = [row for row in summarize(records).speedups if row.category == "overall"]
    assert overall[0].speedup.n == 2
    with pytest.raises(SettingsError, match="repeats"):
        BenchPlan(prompts=prompts(1), samplings=[GREEDY], configs=[SpecConfig("draft", 2)],
                  repeats=0)


def test_greedy_runs_reproduce_the_baseline_output_and_start_cold():
    pair = fake_pair()
    plan = BenchPlan(prompts=prompts(1, ("chat",)), samplings=[GREEDY],
                     configs=[SpecConfig("draft", 3)], max_tokens=16, warmup_tokens=0)
    records = run_benchmark(pair, plan)
    base, spec = records
    assert base.output_tokens == spec.output_tokens == 16
    # Both runs decoded the whole prompt: nothing was reused from the run before.
    calls = pair.target.backend.calls
    prompt_len = base.prompt_tokens
    assert [c for c in calls if c == (0, prompt_len - 1)] == [(0, prompt_len - 1)] * 2


def test_warm_up_is_not_recorded():
    pair = fake_pair()
    plan = BenchPlan(prompts=prompts(1, ("chat",)), samplings=[GREEDY],
                     configs=[SpecConfig("draft", 3), SpecConfig("lookup", 3)], max_tokens=8,
                     warmup_tokens=4)
    records = run_benchmark(pair, plan)
    assert len(records) == 3 and all(r.order >= 0 for r in records)
    # 1 baseline + 2 drafters warmed up, then 3 measured runs, each from an empty cache (each
    # drafter's calibration comes before its first run's cold start, on the cache as it is).
    assert sum(1 for c in pair.target.backend.calls if c[0] == 0) == 6
    assert set(pair.knowledge) == {"draft", "lookup"}


def test_unknown_drafter_or_policy_fails_before_any_run():
    pair = fake_pair()
    for config, msg in [(SpecConfig("magic", 2), "unknown drafter 'magic'"),
                        (SpecConfig("draft", 2, "psychic"), "unknown gamma policy 'psychic'")]:
        plan = BenchPlan(prompts=prompts(1), samplings=[GREEDY], configs=[config])
        with pytest.raises(SettingsError, match=msg):
            run_benchmark(pair, plan)
        assert pair.target.backend.calls == []


@pytest.mark.parametrize("kw, msg", [(dict(configs=[]), "at least one speculative"),
                                     (dict(configs=[SpecConfig("draft", 0)]), "gamma >= 1"),
                                     (dict(prompts=()), "no prompts")])
def test_plan_validation(kw, msg):
    base = dict(prompts=prompts(1), samplings=[GREEDY], configs=[SpecConfig("draft", 2)])
    with pytest.raises(SettingsError, match=msg):
        BenchPlan(**{**base, **kw})


def test_cold_start_empties_target_and_draft_caches():
    pair = fake_pair()
    pair.target.extend([1, 2, 3])
    pair.drafter("draft").session.extend([1, 2])
    cold_start(pair)
    assert pair.target.tokens == [] and pair.drafter("draft").session.tokens == []
    assert pair.target.backend.cache == [] and pair.draft_backend.cache == []


def test_reports_are_written(tmp_path):
    pair = fake_pair()
    plan = BenchPlan(prompts=prompts(2), samplings=[GREEDY],
                     configs=[SpecConfig("draft", 2), SpecConfig("draft", 4)], max_tokens=12)
    records = run_benchmark(pair, plan)
    summary = summarize(records)
    context = {"date": "today", "command": "tandem bench --quick", "machine": "fake"}
    bench_files.write_json(tmp_path / "runs.json", records, summary, context)
    bench_files.write_csv(tmp_path / "runs.csv", records)
    pngs = [bench_plots.speedup_by_category(records, tmp_path / "a.png"),
            bench_plots.gamma_sweep(summary, tmp_path / "b.png"),
            bench_plots.acceptance_by_position(summary, tmp_path / "c.png")]
    md = bench_markdown.render(summary, context, [p.name for p in pngs])
    data = json.loads((tmp_path / "runs.json").read_text())
    assert len(data["runs"]) == len(records) and data["context"]["machine"] == "fake"
    rows = list(csv.DictReader(open(tmp_path / "runs.csv")))
    assert len(rows) == len(records) and "speedup" in rows[0] and "ttft_ms" in rows[0]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("Speedup per category", "Gamma sweep", "Amdahl view", "Leviathan",
                    "Acceptance by position", "![a.png](a.png)", "tandem bench --quick"):
        assert heading in md
    assert "| overall |" in md and "latency-optimal gamma" in md


def test_a_config_can_set_the_adaptive_policys_plain_opening():
    pair = fake_pair()
    made = []
    make = pair.make_policy
    pair.make_policy = lambda *a, **kw: made.append(make(*a, **kw)) or made[-1]
    configs = [SpecConfig("draft", 4, "adaptive", opening=5), SpecConfig("draft", 4, "adaptive")]
    plan = BenchPlan(prompts=prompts(1, ("math",)), samplings=[GREEDY], configs=configs,
                     max_tokens=12, warmup_tokens=0)
    spec = [r for r in run_benchmark(pair, plan) if r.role == "speculative"]
    assert [c.label for c in configs] == ["draft g=4 adaptive open=5", "draft g=4 adaptive"]
    assert sorted(r.config for r in spec) == sorted(c.label for c in configs)
    assert [p.opening_plain for p in made] == [5, 0]


def test_plain_opening_is_refused_for_policies_other_than_adaptive():
    with pytest.raises(SettingsError, match="adaptive policy only"):
        SpecConfig("draft", 3, "fixed", opening=4)
    with pytest.raises(SettingsError, match=">= 0"):
        SpecConfig("draft", 3, "adaptive", opening=-1)


def test_configs_parse_an_optional_opening():
    from app.bench_cli import parse_configs
    configs = parse_configs("draft:fixed:3, hybrid:adaptive:8:16")
    assert configs == [SpecConfig("draft", 3, "fixed"), SpecConfig("hybrid", 8, "adaptive", 16)]
    assert [c.item for c in configs] == ["draft:fixed:3", "hybrid:adaptive:8:16"]
    for bad in ("draft:fixed", "hybrid:adaptive:8:16:2", "hybrid:adaptive:eight"):
        with pytest.raises(SettingsError, match="--configs"):
            parse_configs(bad)
    with pytest.raises(SettingsError, match="adaptive policy only"):
        parse_configs("draft:fixed:3:4")


def test_a_history_configuration_drafts_from_the_earlier_prompts_and_never_its_own_repeat():
    from app.bench_cli import parse_configs
    from bench.benchmark.suite import SuitePrompt
    pair = fake_pair()
    text = "def area(w, h):\n    return w * h\n"
    chosen = [SuitePrompt("first", "a", text), SuitePrompt("again", "a", text)]
    configs = parse_configs("suffix+history:fixed:4,suffix:fixed:4")
    assert configs[0].history and not configs[1].history
    assert configs[0].item == "suffix+history:fixed:4" and configs[0].label == "suffix+history g=4"
    plan = BenchPlan(prompts=chosen, samplings=[GREEDY], configs=configs, max_tokens=16,
                     repeats=2)
    runs = [r for r in run_benchmark(pair, plan) if r.role != "baseline"]
    copied = {(r.prompt_id, r.config, r.role): r.accepted_by.get("suffix", 0) for r in runs}
    # Its first request has no history, and neither has its repeat; the same text as a later
    # request is copied from the history; without +history nothing is.
    assert copied[("first", "suffix+history g=4", "speculative")] == 0
    assert copied[("first", "suffix+history g=4", "speculative-repeat")] == 0
    assert copied[("again", "suffix+history g=4", "speculative")] > 0
    assert not any(v for (_, c, _), v in copied.items() if c == "suffix g=4")
    assert {r.drafter for r in runs if r.config.startswith("suffix+history")} == {"suffix+history"}


def test_a_sweep_plot_only_for_a_sweep_and_raw_runs_in_the_cache(tmp_path, monkeypatch):
    pair = fake_pair()
    one = summarize(run_benchmark(pair, BenchPlan(prompts=prompts(1), samplings=[GREEDY],
                                                  configs=[SpecConfig("draft", 2)], max_tokens=8)))
    two = summarize(run_benchmark(pair, BenchPlan(prompts=prompts(1), samplings=[GREEDY],
                                                  configs=[SpecConfig("draft", 2),
                                                           SpecConfig("draft", 4)], max_tokens=8)))
    assert not bench_plots.swept(one) and bench_plots.swept(two)
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    report = tmp_path / "docs" / "results" / "latest" / "suite"
    report.mkdir(parents=True)
    raw = bench_files.runs_dir(report)
    assert raw.is_dir() and raw.parent == tmp_path / "home" / "runs" and raw.name.endswith(
        "docs-results-latest-suite")
    assert bench_files.runs_file(report) == raw / "runs.json"
    assert bench_files.runs_file(raw / "runs.json") == raw / "runs.json"


SMALL_SCHEMA = {"type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "ok": {"type": "boolean"},
                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                        "maxItems": 2}},
                "required": ["unit", "ok", "tags"], "additionalProperties": False}


def spelled_pair() -> Pair:
    """Instant backends whose tokens are bytes (plus an end-of-generation token and a few
    two-byte pieces), so a grammar compiles for them and tokenizes as they spell."""
    spelling = byte_spelling(320)
    bank = llm_like_bank(320, seed=0, slots=8)
    return Pair(SpelledBackend(bank, "t", spelling),
                SpelledBackend(bank + 0.3 * np.random.default_rng(1).standard_normal(
                    bank.shape, dtype=np.float32), "d", spelling))


def test_a_prompts_constraint_holds_for_its_speculative_and_its_plain_runs():
    pair = spelled_pair()
    spec = GrammarSpec.schema(SMALL_SCHEMA)
    seen = []
    generate = pair.generate

    def spy(prompt, config, **kw):
        for ev in generate(prompt, config, **kw):
            if isinstance(ev, DoneEvent):
                seen.append((kw["drafter"], config.grammar, ev.text, ev.stats.finish_reason))
            yield ev
    pair.generate = spy
    chosen = [SuitePrompt("call", "tool-call", "Call it:", spec),
              SuitePrompt("free", "chat", "Say something:")]
    plan = BenchPlan(prompts=chosen, samplings=[GREEDY, SamplingParams(temperature=0.7)],
                     configs=[SpecConfig("draft", 3), SpecConfig("lookup", 3)], max_tokens=48,
                     warmup_tokens=0)
    records = run_benchmark(pair, plan)
    constrained = [s for s in seen if s[1] is not None]
    # Every row of both samplings of the constrained prompt ran under its schema, compiled for
    # the target; the free prompt ran free.
    assert sorted(d for d, *_ in constrained) == ["draft", "draft", "lookup", "lookup", "plain",
                                                  "plain"]
    assert all(g.spec == spec for _, g, _, _ in constrained)
    assert len(seen) - len(constrained) == 6
    for _, _, text, finish in constrained:
        assert finish == "eos"
        answer = json.loads(text)
        assert answer["unit"] in ("celsius", "fahrenheit") and isinstance(answer["ok"], bool)
    spec_runs = [r for r in records if r.prompt_id == "call" and r.role == "speculative"]
    base_runs = [r for r in records if r.prompt_id == "call" and r.role == "baseline"]
    # Keys and punctuation are forced under speculation; plain decoding decodes every token.
    assert all(r.forced_tokens > 0 for r in spec_runs)
    assert all(r.forced_tokens == 0 for r in base_runs)
    assert all(r.forced_tokens == 0 for r in records if r.prompt_id == "free")
    md = bench_markdown.render(summarize(records), {})
    row = next(r for r in summarize(records).speedups
               if (r.config, r.category, r.sampling) == ("draft g=3", "tool-call", "greedy"))
    assert 0 < row.forced_share < 1 and f"| {row.forced_share:.0%} |" in md
    assert "| forced |" in md


def test_a_constraint_the_target_cannot_follow_fails_before_any_run():
    pair = spelled_pair()
    bad = GrammarSpec.schema({"type": "string", "pattern": "(unclosed"})
    plan = BenchPlan(prompts=[SuitePrompt("bad", "c", "p", bad)], samplings=[GREEDY],
                     configs=[SpecConfig("draft", 3)], max_tokens=8)
    with pytest.raises(SettingsError, match="prompt bad: the JSON schema is not valid"):
        run_benchmark(pair, plan)
    assert pair.target.backend.cache == []
