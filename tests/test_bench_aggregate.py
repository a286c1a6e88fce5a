"""Aggregation and theory on synthetic run records (no model involved)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.benchmark.aggregate import (amdahl_rows, gamma_sweep, leviathan_rows, position_curves,
                                        quantiles, sampling_label, speedup_rows, summarize)
from bench.benchmark.records import RunRecord, pair_with
from bench.benchmark.gpu_profile import measured
from bench.benchmark.theory import (amdahl_speedup, expected_tokens_per_round, gpu_profile_speedup,
                                          predicted_speedup)

DEFAULTS = dict(order=0, prompt_id="p", category="math", role="baseline", config="baseline",
                drafter="plain", policy="plain", gamma=0, temperature=0.0, top_k=0, top_p=1.0,
                min_p=0.0, seed=None, batch_size=1, prompt_tokens=20, output_tokens=40,
                drafted_tokens=0, accepted_tokens=0, rejected_rounds=0, rounds=40, target_calls=40,
                acceptance_rate=0.0, accepted_per_target_call=0.0, tokens_per_target_call=1.0,
                mean_gamma=0.0, draft_ms=0.0, verify_ms=0.0, prefill_ms=1000.0, ttft_ms=1100.0,
                total_ms=5000.0, decode_ms=4000.0, tokens_per_s=10.0, finish_reason="length")


def rec(**kw) -> RunRecord:
    return RunRecord(**{**DEFAULTS, **kw})


def spec(order, base, speedup, gamma=4, category="math", accepted=30, drafted=40, **kw):
    r = rec(order=order, role="speculative", config=f"draft g={gamma}", drafter="draft-model",
            policy="fixed", gamma=gamma, mean_gamma=float(gamma), category=category,
            drafted_tokens=drafted, accepted_tokens=accepted, target_calls=10,
            tokens_per_s=base.tokens_per_s * speedup, decode_ms=base.decode_ms / speedup,
            total_ms=base.prefill_ms + base.decode_ms / speedup, **kw)
    pair_with(r, base)
    return r


def test_theory_closed_forms():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    # Leviathan's own form is v = 1; alpha 0 can only lose time.
    assert predicted_speedup(0.0, 3, 0.1, 1.0) == pytest.approx(1 / 1.3)
    assert predicted_speedup(0.8, 4, 0.05, 1.0) == pytest.approx((1 - 0.8**5) / 0.2 / 1.2)
    assert amdahl_speedup(0.0, 2.0) == 2.0
    assert amdahl_speedup(0.5, 2.0) == pytest.approx(1 / 0.75)
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 2)


def test_pairing_sets_decode_and_end_to_end_speedups():
    base = rec(order=0)
    r = spec(1, base, 2.0)
    assert r.baseline_order == 0
    assert r.speedup == pytest.approx(2.0)
    # e2e: baseline 5000 ms for 40 tokens; speculative 1000 + 2000 ms for 40 tokens.
    assert r.e2e_speedup == pytest.approx(5000 / 3000)


def test_quantiles_and_fraction_slower_per_category_and_overall():
    records = []
    speedups = {"math": [0.8, 1.2, 1.5, 2.0], "chat": [0.5, 0.9, 1.1, 1.3]}
    order = 0
    for cat, values in speedups.items():
        for s in values:
            base = rec(order=order, category=cat)
            records += [base, spec(order + 1, base, s, category=cat)]
            order += 2
    rows = {r.category: r for r in speedup_rows(records)}
    assert set(rows) == {"math", "chat", "overall"}
    assert rows["math"].speedup.median == pytest.approx(1.35)
    assert rows["chat"].fraction_slower == 0.5
    assert rows["overall"].fraction_slower == pytest.approx(3 / 8)
    allv = speedups["math"] + speedups["chat"]
    assert rows["overall"].speedup.p10 == pytest.approx(np.percentile(allv, 10))
    assert rows["overall"].speedup.n == 8
    assert rows["math"].acceptance_rate == pytest.approx(0.75)


def test_gamma_sweep_picks_latency_optimal_not_acceptance_optimal():
    records, order = [], 0
    # Acceptance falls with gamma, speedup peaks at gamma 4.
    table = {2: (1.3, 36), 4: (1.7, 30), 6: (1.5, 24)}
    for _ in range(3):
        base = rec(order=order)
        records.append(base)
        for g, (s, acc) in table.items():
            order += 1
            records.append(spec(order, base, s, gamma=g, accepted=acc))
        order += 1
    points, best = gamma_sweep(records)
    assert [p.gamma for p in points] == [2, 4, 6]
    (b,) = best
    assert (b.latency_optimal_gamma, b.acceptance_optimal_gamma) == (4, 2)
    assert b.latency_optimal_speedup == pytest.approx(1.7)


def test_amdahl_view_uses_the_baseline_prefill_share():
    base = rec(order=0, prefill_ms=1000.0, total_ms=5000.0)
    r = spec(1, base, 2.0)
    (a,) = amdahl_rows([base, r])
    assert a.prefill_share == pytest.approx(0.2)
    assert a.allowed_e2e_speedup == pytest.approx(1 / (0.2 + 0.8 / 2.0))
    assert a.measured_e2e_speedup == pytest.approx(r.e2e_speedup)


def test_leviathan_row_from_measured_costs():
    base = rec(order=0, decode_ms=4000.0, output_tokens=40)  # 100 ms per token
    r = spec(1, base, 2.0, gamma=4, accepted=32, drafted=40, draft_ms=400.0, verify_ms=1300.0)
    (row,) = leviathan_rows([base, r])
    assert row.alpha == pytest.approx(0.8)
    assert row.cost_ratio == pytest.approx(0.1)  # 10 ms per drafted token / 100 ms
    assert row.verify_ratio == pytest.approx(1.3)  # 130 ms per verify call / 100 ms
    assert row.predicted_speedup == pytest.approx(expected_tokens_per_round(0.8, 4) / (0.4 + 1.3))
    assert row.measured_speedup == pytest.approx(2.0)


def test_acceptance_by_draft_and_output_position():
    base = rec(order=0)
    a = spec(1, base, 1.5, drafted_at=[4, 4, 2], accepted_at=[4, 2, 1],
             origins=["draft", "draft", "correction", "draft"] + ["bonus"] * 4)
    b = spec(2, base, 1.5, drafted_at=[2], accepted_at=[0], origins=["correction"] * 8 + ["draft"])
    (c,) = position_curves([base, a, b], bucket=4)
    assert c.by_draft_position == pytest.approx([4 / 6, 2 / 4, 1 / 2])
    # Bucket 0: 3 drafts of 8 tokens; bucket 1: 0 of 4 (a's bonus) + 4 corrections; bucket 2: 1/1.
    assert c.by_output_position == pytest.approx([3 / 8, 0.0, 1.0])


def test_sampling_label_and_empty_quantiles():
    assert sampling_label(rec()) == "greedy"
    assert sampling_label(rec(temperature=0.7, top_p=0.9)) == "t=0.7 top-p=0.9"
    q = quantiles([None, float("nan")])
    assert q.n == 0 and math.isnan(q.median)


def test_summarize_is_json_ready():
    import json
    base = rec(order=0)
    s = summarize([base, spec(1, base, 1.4)])
    text = json.dumps(s.as_dict())
    assert '"latency_optimal_gamma": 4' in text


def test_forced_share_tokens_per_second_and_the_gpu_profile_beside_the_speedup():
    base = rec(order=0, tokens_per_s=10.0)
    # 40 tokens: 12 forced, 10 target calls, 20 tokens drafted by the draft model.
    run = spec(1, base, 1.5, forced_tokens=12, drafted_by={"draft-model": 20}, drafted_at=[10, 10])
    free = rec(order=2, prompt_id="q", tokens_per_s=12.0)
    other = spec(3, free, 1.0, prompt_id="q")
    overall = next(r for r in speedup_rows([base, run, free, other]) if r.category == "overall")
    assert overall.forced_share == pytest.approx(12 / 80)
    assert overall.tokens_per_s == pytest.approx(13.5)
    assert overall.baseline_tokens_per_s == pytest.approx(11.0)
    # The measured GPU profile: 40 tokens for 10 verifies of 3 tokens and 20 drafted, and 40
    # for 10 calls of one token (4).
    gpu = measured()
    drafting = 40 / (10 * gpu.verify(3) / gpu.verify(1) + 20 * gpu.draft_cost)
    assert gpu_profile_speedup(40, 10, [10, 10], 20) == pytest.approx(drafting)
    assert overall.gpu_profile == pytest.approx(np.median([drafting, 4.0]))
    assert math.isnan(gpu_profile_speedup(0, 0, [], 0))
